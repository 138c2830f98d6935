"""Source text to tensor-expression IR: grammar, parser (AST with spans) and sema."""
