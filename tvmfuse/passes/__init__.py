"""Graph passes over the Relax module (tvm.ir.transform module passes) and per-target pass lists."""
