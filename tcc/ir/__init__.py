"""The IRs: scalar expressions (shared), tensor expressions (TE) and loops."""
