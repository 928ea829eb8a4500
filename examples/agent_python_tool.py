"""The Python-tool task written as an agent against the OpenAI API: `parity/PythonTool-v0`'s
episode (write Python, read its output, answer in <ans></ans>), but played by this program
through the official `openai` SDK. Trained by `parity train examples/agent.toml`.

    uv run parity envs check examples.agent_python_tool:parity/AgentPythonTool-v0
"""

from parity.envs import register_env
from parity.envs.answers import head_tail, same_answer
from parity.envs.tools import TaggedCodeParser, extract_tag

PARSER = TaggedCodeParser()  # <py>code</py>, the embedded model's tool format


async def run(client, task, sandbox) -> float:
    """One episode: up to 4 model turns; reward 1 for the right answer in <ans></ans>."""
    messages = [{"role": "user", "content": task["question"]}]
    for _ in range(4):
        reply = await client.chat.completions.create(model="policy", messages=messages)
        text = reply.choices[0].message.content
        messages.append({"role": "assistant", "content": text})
        if (answer := extract_tag(text, "ans")) is not None:
            return float(same_answer(answer, task["answer"]))
        parsed = PARSER.parse(text)
        if parsed.call is None:
            error = parsed.error or "error: no tool call and no <ans>answer</ans> found"
            messages.append({"role": "user", "content": error})
            continue
        result = await sandbox.run_python(parsed.call.arguments["code"])
        messages.append({"role": "tool", "content": head_tail(result.stdout + result.stderr, 2000)})
    return 0.0


def oracle(segment) -> str:
    """The ideal next model turn (for `parity envs check`): run the task's code, then answer."""
    outputs = [m["content"] for m in segment.messages if m["role"] == "tool"]
    if not outputs:
        return f"<py>print({segment.task['code']})</py>"
    return f"<ans>{outputs[-1].strip()}</ans>"


register_env(
    "parity/AgentPythonTool-v0", "parity.envs.agent:AgentEnv",
    "parity/PythonTool-v0's task played by an OpenAI-SDK agent program.",
    agent=run, oracle=oracle, sandbox_backend="local",
    task_source="parity.envs.python_tool:generate_task",
    task_kwargs={"difficulty": 0, "kinds": ["mul"]},  # the embedded default env's tasks
)
