# Sourced by the GPU scripts: record_environment writes OUT/environment.txt (date, host, torch, CUDA, transformers,
# the device and nvidia-smi's view of it) and prints it; it fails, saying so, when swarmlm is not installed.
record_environment() {
    local out=$1 py=$2
    {
        echo "date: $(date -u +%FT%TZ)"
        echo "host: $(hostname)"
        "$py" -c 'import torch, transformers, swarmlm; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__); print("device:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu")'
        command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    } > "$out/environment.txt" 2>&1 || { cat "$out/environment.txt"; echo "swarmlm is not installed here: pip install -e ." >&2; return 1; }
    cat "$out/environment.txt"
}
