#!/usr/bin/env bash
# Submit a training job to a running Ray cluster through its job server (dashboard port).
#   launch/submit.sh [--address http://HEAD:8265] [--no-wait] [--env KEY=VALUE ...] -- key=value ...
# e.g.
#   launch/submit.sh --address http://10.0.0.1:8265 -- --config-name qwen3_8b train.plan.max_steps=100
#   launch/submit.sh --env WANDB_API_KEY="$WANDB_API_KEY" -- logger=wandb
# The address defaults to $RAY_API_SERVER_ADDRESS, then $RAY_ADDRESS, then http://127.0.0.1:8265.
# Everything after `--` goes to `python -m pipeline.train` (Hydra overrides).
#
# Token authentication: a cluster started while a token is at hand (RAY_AUTH_TOKEN,
# RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token) requires it on every request, but Ray's job CLI
# sends the token only when RAY_AUTH_MODE=token. So, unless RAY_AUTH_MODE is set already (e.g.
# RAY_AUTH_MODE=disabled for a private test cluster), this script sets it whenever a token is
# at hand; a cluster without authentication ignores the token.
set -euo pipefail

usage() { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

address="${RAY_API_SERVER_ADDRESS:-${RAY_ADDRESS:-http://127.0.0.1:8265}}"
wait_flag=()
env_lines=""  # extra env_vars, as YAML lines, for this job only
while [[ $# -gt 0 ]]; do
  case "$1" in
    --address) [[ $# -ge 2 ]] || usage; address="$2"; shift 2 ;;
    --address=*) address="${1#*=}"; shift ;;
    --no-wait) wait_flag=(--no-wait); shift ;;
    --env)
      [[ $# -ge 2 && "$2" == *=* ]] || usage
      key="${2%%=*}" value="${2#*=}"
      value="${value//\\/\\\\}"; value="${value//\"/\\\"}"  # a YAML double-quoted string
      env_lines+="  ${key}: \"${value}\""$'\n'; shift 2 ;;
    --) shift; break ;;
    *) usage ;;
  esac
done

# Ray uploads the working dir: run from the repository root, wherever we were called from.
cd "$(dirname "$0")/.."

if [[ -z "${RAY_AUTH_MODE:-}" ]] && [[ -n "${RAY_AUTH_TOKEN:-}" || -n "${RAY_AUTH_TOKEN_PATH:-}" \
      || -f "${HOME}/.ray/auth_token" ]]; then
  export RAY_AUTH_MODE=token
fi

# --runtime-env and --runtime-env-json exclude each other: extra env vars go into a copy of
# the runtime env file, below its `env_vars:` line.
runtime_env=launch/runtime_env.yaml
if [[ -n "$env_lines" ]]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  printf '%s' "$env_lines" > "$tmp/extra"
  sed "/^env_vars:/r $tmp/extra" launch/runtime_env.yaml > "$tmp/runtime_env.yaml"
  runtime_env="$tmp/runtime_env.yaml"
fi

ray job submit --address "$address" --working-dir . --runtime-env "$runtime_env" \
  "${wait_flag[@]}" -- python -m pipeline.train "$@"
