"""Named locks with owner tokens, TTLs and fencing tokens."""
