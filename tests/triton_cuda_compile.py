"""Compile every variant of the Triton attention kernels for a Hopper GPU (sm_90) with triton's own compiler and
ptxas, here on the CPU: what triton's interpreter does not check (it runs the Python, where any global is readable).

Run as its own process, without TRITON_INTERPRET (tests/test_triton_attention.py does): triton's interpreter patches
the language's functions for the whole process once an interpreted kernel exists (triton 3.9), so a compilation in a
process that ran the interpreter tests fails inside the interpreter's builder."""

import inspect
import os
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


def compile_for_cuda(kernel, constexprs: dict) -> None:
    """One kernel variant: pointers are bf16 but for the fp32 buffers, masks u8 and ranges i32; ints i32."""
    params = list(inspect.signature(kernel.fn).parameters)
    kinds = {"MASK": "*u8", "MIS": "*u8", "RANGES": "*i32", "scale_log2": "fp32"}
    fp32 = {"LSE", "SEG", "DSEG", "DELTA", "DK", "DV", "DQU", "DQV", "DR"}
    signature = {p: "constexpr" if p in constexprs else kinds.get(p, "*fp32" if p in fp32 else
                                                                     "*bf16" if p[0].isupper() else "i32")
                 for p in params}
    source = ASTSource(kernel, signature, constexprs={(params.index(n),): v for n, v in constexprs.items()})
    triton.compile(source, target=GPUTarget("cuda", 90, 32))


def main() -> None:
    if os.environ.get("TRITON_INTERPRET"):
        sys.exit("TRITON_INTERPRET is set; expected a process without it (the interpreter's builder would compile)")
    from modeling_xl import relative_attention_triton_kernels as kernels

    base = dict(HAS_MASK=True, BLOCK_M=64, BLOCK_N=64, BLOCK_D=64, PRECISION="ieee")
    for seg in (False, True):
        compile_for_cuda(kernels.forward_kernel, dict(base, HAS_SEG=seg))
        compile_for_cuda(kernels.backward_keys_kernel, dict(base, HAS_SEG=seg))
        for bands in (False, True):
            compile_for_cuda(kernels.backward_queries_kernel, dict(base, HAS_SEG=seg, BANDS=bands))
    print("compiled 8 kernel variants for sm_90")


if __name__ == "__main__":
    main()
