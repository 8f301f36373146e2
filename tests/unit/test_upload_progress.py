"""An uploading rank's progress: the bytes fsspec transfers, told at intervals while they grow."""

import threading
import time

import fsspec

from elastic_train.storage.upload_progress import ByteCount, ProgressReporter, report_interval_s


def test_byte_count_follows_every_file_of_a_put(tmp_path):
    sizes = [10, 70_000, 3]
    local = []
    for i, size in enumerate(sizes):
        path = tmp_path / f"f{i}"
        path.write_bytes(b"x" * size)
        local.append(str(path))
    count = ByteCount()
    fsspec.filesystem("memory").put(local, [f"/up/f{i}" for i in range(len(sizes))],
                                    callback=count)
    assert count.counter.value == sum(sizes)


class NotedStore:
    def __init__(self):
        self.noted = []
        self.lock = threading.Lock()

    def note_progress(self, index, rank, uploaded_bytes):
        with self.lock:
            self.noted.append((index, rank, uploaded_bytes))


def test_progress_is_told_while_it_grows_and_only_then():
    store = NotedStore()
    with ProgressReporter(store, 7, 1, interval_s=0.05) as progress:
        time.sleep(0.2)  # nothing sent yet: nothing told
        assert store.noted == []
        progress.callback.branched("a", "b").relative_update(100)
        time.sleep(0.2)
        progress.callback.branched("c", "d").relative_update(50)
        time.sleep(0.2)
    assert store.noted == [(7, 1, 100), (7, 1, 150)]


def test_the_interval_lets_the_committing_rank_see_every_advance():
    assert report_interval_s(120) == 5.0
    assert report_interval_s(4) == 1.0
    assert report_interval_s(0.1) == 0.2
