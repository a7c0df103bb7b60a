#!/usr/bin/env bash
# The wheels python -m bench.peers needs on the GPU machine (no registry there): the project's
# bundle (ray, omegaconf, hydra), gguf and accelerate (the GGUF target; the GPU tier needs them
# too), the two peer trainers and what they import that the machine's image lacks, into
# .devbundle/ (git-ignored), installed there by
#   bash .devbundle/install && export PYTHONPATH=/tmp/site:$PYTHONPATH
# pulp's wheel carries solver binaries for every platform (35 MB installed); ModelOpt only
# imports pulp (its NAS searcher), so they are dropped to keep the travelling tree under 64 MiB.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
bundle=${BUNDLE:-$root/../shared/gpu/bundle}
"$bundle" nvidia-modelopt==0.47.0 speculators==0.9.0 hs-connectors==0.9.0 \
  datasets==5.1.0 dill==0.4.1 multiprocess==0.70.19 pulp==3.3.2 openai==3.63.0 jiter \
  loguru==0.7.3 pydantic==2.14.4 pydantic-core==2.50.5 pydantic-settings==2.16.3 \
  typing-inspection==0.4.5 annotated-types python-dotenv==1.2.4 gguf==0.19.0 \
  accelerate==1.16.0
python3 - "$root/.devbundle" <<'PY'
import glob, os, sys, zipfile
for wheel in glob.glob(os.path.join(sys.argv[1], "pulp-*.whl")):
    slim = wheel + ".slim"
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            if not item.filename.startswith("pulp/solverdir/"):
                dst.writestr(item, src.read(item.filename))
    os.replace(slim, wheel)
PY
du -sh "$root/.devbundle"
