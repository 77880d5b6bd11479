"""Gradient attribution and circuit discovery on the hooked model: attribution patching over nodes
(AtP, AtP*), edge attribution (EAP, EAP-IG), circuits evaluated exactly by patching, and their
faithfulness."""
