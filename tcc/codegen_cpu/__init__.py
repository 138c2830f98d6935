"""Loop IR -> LLVM IR (llvmlite.ir) -> machine code for the host CPU, loaded with MCJIT."""
