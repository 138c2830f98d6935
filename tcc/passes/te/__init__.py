"""TE-level passes: tensor expressions in, tensor expressions out (fusion, im2col, gradients,
specialisation, bounds proofs), ending with ``lower``, which turns a TE op into loops."""
