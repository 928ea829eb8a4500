"""The persistent Python interpreter of a session, run inside the sandbox by the helper.

Started as `python3 -u -c <this source> CODE_FD DONE_FD`; standard library only. Reads
length-prefixed UTF-8 code from CODE_FD, runs it in one global namespace kept across calls
(a last bare expression is echoed like the interactive prompt does), then writes the status,
"0" or "1" (an exception, its traceback on stderr), and a newline to DONE_FD.
"""

import ast
import os
import struct
import sys
import traceback

code_fd, done_fd = int(sys.argv[1]), int(sys.argv[2])
sys.argv = [""]
namespace = {"__name__": "__main__", "__builtins__": __builtins__}


def read_exact(n):
    buf = b""
    while len(buf) < n:
        chunk = os.read(code_fd, n - len(buf))
        if not chunk:
            sys.exit(0)
        buf += chunk
    return buf


def execute(source):
    tree = ast.parse(source, "<session>", "exec")
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, "<session>", "exec"), namespace)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), "<session>", "eval"), namespace)
        if value is not None:
            print(repr(value))


while True:
    (size,) = struct.unpack(">I", read_exact(4))
    source = read_exact(size).decode("utf-8", "replace")
    status = 0
    try:
        execute(source)
    except SystemExit:
        raise
    except BaseException:
        status = 1
        traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    os.write(done_fd, b"%d\n" % status)
