"""Loop primitives: the steps a user names in a schedule (split, reorder, fuse, unroll, vectorize,
parallel, bind, cache, compute_at, inline, decompose), each one module, and ``schedule`` applying them."""
