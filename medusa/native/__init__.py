"""Native code: the C library the decoder's fast paths call (:mod:`medusa.native.library`) and the picks
made from logits through it (:mod:`medusa.native.pick`)."""
