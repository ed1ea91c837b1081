"""Row 1 of issue 25: the secret scrubber must not be an oracle.

A client that can make the model repeat what it says (the embedded scripted model echoes)
sends candidate strings and reads what any client reads: the text, `[redacted]` markers and,
streaming, the delta boundaries. The attack (tests/hostile/oracle_attack.py) learnt the
upstream key and the other tenant's key character by character on the scrubber that held
back any tail that could start a key and redacted a long one at the end of the stream:
streamed from nothing, non-streaming from the public prefix `sk-proj-`, with and without
`--api-key`. Here it gets a few hundred turns per variant; no observation may differ from
the rest of its round, and no character of any key may be learnt. (The note's figure, for
10,000 turns a variant: `python tests/hostile/oracle_attack.py`.)
"""

from __future__ import annotations

import pytest
from oracle_attack import ALPHABET, VARIANTS, Variant, attack

TURNS = 10 * len(ALPHABET)  # ten rounds: on the old scrubber, 3 to 10 characters of a key


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])
async def test_an_echoing_model_teaches_a_client_nothing_of_any_key(variant: Variant) -> None:
    result = await attack(variant, TURNS)
    assert result.turns == TURNS  # the attack ran its whole budget
    print(f"\n{variant.name}: {result.differing} observations differed, learnt {result.learnt}")
    assert result.learnt == dict.fromkeys(result.learnt, 0)
    assert result.differing == 0  # nothing a client sees depends on a partial match
