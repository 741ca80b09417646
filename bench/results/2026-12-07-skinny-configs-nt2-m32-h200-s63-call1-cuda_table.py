# session 63 call 1 (an H200): bench/skinny_configs.py --ms 24,32 --w12-only --adopt-ws --nts 2 (2026-12-07-skinny-configs-nt2-m32-h200-s63-call1.md); W12_CUDA_TABLE
TABLE = {
    (5120, 8192, 32, False): CudaConfig(nt=2, warps=4, unroll=1, split=1, l2=0, xreg=False),
}
