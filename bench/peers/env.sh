# Shared settings of bench/peers/*.sh (sourced once MODEL has the script's default): the work
# directory (llama.cpp, its venv, the GGUFs), the repository root and this folder, the Q8_0
# GGUF of MODEL and the llama-bench, llama-completion and llama-tokenize binaries.
set -euo pipefail
W=${PEERS_WORK:-/tmp/peers}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
GGUF=${GGUF:-$W/$(basename "$MODEL")-q8_0.gguf}
BENCH=$W/llama.cpp/build/bin/llama-bench
COMPLETION=$W/llama.cpp/build/bin/llama-completion
TOKENIZE=$W/llama.cpp/build/bin/llama-tokenize
