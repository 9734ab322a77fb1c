"""``voiceedge bench hostile``: hostile input against a live edge (fuzzing, flood, signaling abuse, resource hygiene)."""
