import os

# Triton kernels run on the CPU through the interpreter in tests. Triton reads this when @triton.jit
# decorates a function, so it must be set before any kernel module is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")
