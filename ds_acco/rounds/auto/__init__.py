"""``mode: "auto"``: what it chooses and why (:mod:`.choice`), the gradient noise scale that prices smaller batches
(:mod:`.noise_scale`), and the engine's side: its timer, when a choice is due, applying it (:mod:`.mode`).

Part of the rounds layer (L3); imports what ``ds_acco.rounds`` may.
"""
