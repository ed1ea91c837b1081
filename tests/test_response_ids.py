"""Ids: OpenAI's shape, never repeated, not even across a fork."""

from __future__ import annotations

import os
import re

from streamer.core.response import new_id


def test_ids_have_the_shape_and_do_not_repeat() -> None:
    ids = [new_id("resp") for _ in range(20_000)]  # many ids, none repeated
    assert all(re.fullmatch(r"resp_[0-9a-f]{48}", i) for i in ids)
    assert len(set(ids)) == len(ids)


def test_a_forked_child_does_not_repeat_its_parents_next_ids() -> None:
    new_id("resp")  # whatever state ids keep exists before the fork
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(write, " ".join(new_id("resp") for _ in range(3)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 4096).decode().split()
    os.close(read)
    parent = [new_id("resp") for _ in range(3)]
    assert len(child) == 3
    assert not set(child) & set(parent)
