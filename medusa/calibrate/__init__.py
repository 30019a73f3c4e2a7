"""Calibration: the heads' accuracy on held-out data -> ``tree.json`` (:mod:`medusa.calibrate.calibrate`),
the one ``--nodes auto`` chooser (:mod:`medusa.calibrate.auto`) and the plots (:mod:`medusa.calibrate.plot`).

It runs the model, so it sits above decoding and modeling; the pure tree structure it builds lives in
:mod:`medusa.tree`."""
