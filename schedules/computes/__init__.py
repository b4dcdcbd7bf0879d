"""Target-neutral TE computes: a partition interpreted into one TE graph (:mod:`.partition`), the anchors' FP32
and INT8 computes, their weight packings, the row kernels and their numpy references. The backends schedule
what these compute."""
