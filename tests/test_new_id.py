"""Response ids: OS randomness from a pool, never repeated, never shared with a forked child."""

from __future__ import annotations

import os
import re

from streamer.core import response
from streamer.core.response import new_id


def test_ids_have_the_openai_shape_and_do_not_repeat_across_refills() -> None:
    count = 3 * response._RandomPool.SIZE // 24  # three refills of the pool
    ids = [new_id("resp") for _ in range(count)]
    assert all(re.fullmatch(r"resp_[0-9a-f]{48}", i) for i in ids)
    assert len(set(ids)) == count


def test_a_forked_child_draws_its_own_ids() -> None:
    new_id("warm")  # the parent's pool holds bytes the child must not reuse
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, to the parent
        os.close(read)
        os.write(write, new_id("resp").encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 100).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert child != new_id("resp")  # the parent's next id: what the child would have repeated
