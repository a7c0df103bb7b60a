#!/usr/bin/env bash
# Start the Ray head of a training cluster, with token authentication, ready for launch/submit.sh.
#   launch/start_head.sh [more `ray start` options]      # e.g. --num-gpus=8
#   RAY_AUTH_MODE=disabled launch/start_head.sh           # no authentication: a private test box
# Ports: RAY_PORT (GCS, default 6379) and RAY_DASHBOARD_PORT (job server, default 8265).
# Then, with the token printed by `ray get-auth-token` on the head:
#   RAY_AUTH_MODE=token RAY_AUTH_TOKEN=<token> ray start --address=HEAD:6379      # other nodes
#   RAY_AUTH_TOKEN=<token> launch/submit.sh --address http://HEAD:8265 -- ...    # submitters
set -euo pipefail

# Ray 2.60 enables token authentication for a head started while a token is at hand
# (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token): make one unless told not to.
if [[ "${RAY_AUTH_MODE:-}" != disabled && -z "${RAY_AUTH_TOKEN:-}${RAY_AUTH_TOKEN_PATH:-}" ]]; then
  ray get-auth-token --generate > /dev/null  # writes ~/.ray/auth_token once, then reuses it
fi

# The NVLink-multicast safety settings of launch/runtime_env.yaml, for every process the
# cluster starts, also those outside a job.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

# The job server listens on all interfaces so other machines can submit: keep token
# authentication on wherever that network is shared.
ray start --head --port="${RAY_PORT:-6379}" --dashboard-host=0.0.0.0 \
  --dashboard-port="${RAY_DASHBOARD_PORT:-8265}" --disable-usage-stats "$@"
