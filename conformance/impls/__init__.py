"""Built-in implementations, selectable by name with --impl."""

BUILTINS = {
    "reference": "conformance.impls.reference:make",
    "triton": "pnmix.protocol:make",
}
