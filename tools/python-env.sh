#!/usr/bin/env bash
# The one Python virtual environment of every PyTorch-using test and bench: creates it or reuses it, installs what is
# missing, and prints its python's path (the only line on stdout; progress goes to stderr).
#
#   tools/python-env.sh                   # torch (CPU build), numpy, transformers
#   tools/python-env.sh deepspeed ninja   # and these PyPI packages too, into the same environment, on demand
#   python=$(tools/python-env.sh) && CHUNKWISE_TORCH_PYTHON=$python ctest --preset default -R torch_export
#
# Where: $CHUNKWISE_VENV, default ${XDG_CACHE_HOME:-~/.cache}/chunkwise/venv (outside the checkout, kept between runs
# and shared by every checkout of this user). torch comes from PyTorch's CPU-only index ($CHUNKWISE_TORCH_INDEX,
# default https://download.pytorch.org/whl/cpu; about 1 GB in all); where that index cannot be reached (or is set
# empty), from PyPI, whose wheel brings the CUDA libraries (5-6 GB in all). An environment that already has a torch
# (any build) keeps it. Needs python3 with its venv module (Debian: python3-venv; tools/install-deps.sh --tests installs it).
# Exits 1, saying why, when something cannot be installed; callers that can do without torch carry on.
set -euo pipefail

venv=${CHUNKWISE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/chunkwise/venv}
torch_index=${CHUNKWISE_TORCH_INDEX-https://download.pytorch.org/whl/cpu}
base=(torch numpy transformers)
wanted=("${base[@]}" "$@")
say() { echo "python-env.sh: $*" >&2; }

python=$venv/bin/python
# Which of the wanted distributions the environment lacks (names as pip knows them: py-cpuinfo, not cpuinfo).
lacking() {
  "$python" - "$@" <<'PY'
import importlib.metadata as metadata, sys
for name in sys.argv[1:]:
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        print(name)
PY
}

# The fast path, without a lock: everything is there.
if [[ -x $python ]] && missing=$(lacking "${wanted[@]}" 2>/dev/null) && [[ -z $missing ]]; then
  echo "$python"
  exit 0
fi

mkdir -p "$(dirname "$venv")"
# One installer at a time (CI and a bench may start together); the second waits, then finds everything there.
exec 9>"$venv.lock"
command -v flock >/dev/null && flock 9

if ! "$python" -c "" 2>/dev/null; then
  if [[ -e $venv && ! -f $venv/pyvenv.cfg ]]; then
    say "$venv exists and is not a virtual environment; move it away or set CHUNKWISE_VENV"
    exit 1
  fi
  command -v python3 >/dev/null || { say "python3 not found (Debian: apt-get install python3 python3-venv)"; exit 1; }
  if ! python3 -c "import ensurepip, venv" 2>/dev/null; then
    say "python3 has no venv module with pip (Debian: apt-get install python3-venv, or tools/install-deps.sh --tests)"
    exit 1
  fi
  say "creating the virtual environment $venv"
  python3 -m venv --clear "$venv" >&2 || { say "python3 -m venv $venv failed"; exit 1; }
fi

pip() { "$python" -m pip --disable-pip-version-check --no-input "$@" >&2; }
missing=$(lacking "${wanted[@]}") || { say "$python cannot run; remove $venv and try again"; exit 1; }
[[ -z $missing ]] && { echo "$python"; exit 0; }

if grep -qx torch <<<"$missing"; then
  say "installing torch into $venv$([[ -n $torch_index ]] && echo " from $torch_index")"
  if ! { [[ -n $torch_index ]] && pip install -q --retries 0 --timeout 30 torch --index-url "$torch_index"; }; then
    [[ -n $torch_index ]] && say "that failed; trying PyPI's torch (with CUDA libraries, several GB)"
    pip install -q torch || { say "pip install torch failed"; exit 1; }
  fi
fi
rest=$(grep -vx torch <<<"$missing" || true)
if [[ -n $rest ]]; then
  mapfile -t rest <<<"$rest"
  say "installing ${rest[*]} into $venv"
  # Keep the torch there (the CPU build): a package that asks for torch must not pull PyPI's CUDA one over it.
  pip install -q "${rest[@]}" -c <("$python" -c "import importlib.metadata as m; print('torch==' + m.version('torch'))") \
    || { say "pip install ${rest[*]} failed"; exit 1; }
fi
echo "$python"
