"""Built-in implementations, selectable by name with --impl."""

BUILTINS = {
    "reference": "conformance.impls.reference:make",
    "kivi": "conformance.impls.reference:make_kivi",
    "kitty": "conformance.impls.reference:make_kitty",
    "fp16": "conformance.impls.reference:make_fp16",
    "triton": "pnmix.protocol:make",
    "kivi-triton": "pnmix.protocol:make_kivi",
    "kitty-triton": "pnmix.protocol:make_kitty",
}
