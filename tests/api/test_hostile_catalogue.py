"""Hostile inputs to the catalogue and /search (issue 36): numbers too large for a float, ids
that numpy would change or a route could not name, attribute keys without end, updates that time
out, near-duplicate examples, a disk that fills up mid-update. Real server processes, real
clients; what is asserted is what a client sees, and what the catalogue on disk holds after.
"""

from __future__ import annotations

import base64
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from benchmarks.serving import ServerNotReady
from benchmarks.serving import server_process as start_server
from service.model.search import read_catalogue, search_dir
from service.model.search.layout import catalogue_dir
from tests.api.conftest import server_process
from tests.catalogues import attributes_of, rebuild_catalogue
from tests.namespaces import needs_namespaces

pytestmark = pytest.mark.slow

TOKEN = "hostile-catalogue-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ITEMS = "/v1/models/digits/catalogue/items"
CATALOGUE = "/v1/models/digits/catalogue"
WAIT_S = 60.0
HUGE = 10**400  # a JSON integer no float holds


@pytest.fixture(scope="module")
def attributed_model(search_model_dir, digits, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hostile-catalogue") / "digits"
    shutil.copytree(search_model_dir, path)
    return rebuild_catalogue(path, digits, 300, attributes_of(797))


@pytest.fixture(scope="module")
def served_model(attributed_model, tmp_path_factory) -> Path:
    """The copy of the attributed model that :func:`server` serves (and updates)."""
    model = tmp_path_factory.mktemp("hostile-catalogue-served") / "digits"
    shutil.copytree(attributed_model, model)
    return model


@pytest.fixture(scope="module")
def server(served_model):
    """:func:`served_model` served with an admin token and batches of 1,000 (the issue's
    upsert)."""
    with server_process(served_model, ADMIN_TOKEN=TOKEN, MAX_BATCH_SIZE="1000") as running:
        yield running


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=WAIT_S) as client:
        yield client


def _images(digits, n: int, start: int = 0) -> list:
    return digits.X_train[start : start + n].reshape(n, 8, 8).tolist()


def _refused(response: httpx.Response, status: int, says: str) -> str:
    assert response.status_code == status, response.text[:500]
    message = response.json()["error"]["message"]
    assert says in message, message
    return message


def _version(http: httpx.Client) -> int:
    return http.get(CATALOGUE).json()["version"]


# -- defect 3: numbers too large for a float -------------------------------------------------


@pytest.mark.parametrize(
    ("clause", "names"),
    [
        ({"key": "year", "match": {"value": HUGE}}, "filter.must[0].match.value"),
        ({"key": "year", "match": {"any": [1999, HUGE]}}, "filter.must[0].match.any"),
        ({"key": "year", "range": {"gt": HUGE}}, "filter.must[0].range.gt"),
        ({"key": "year", "range": {"lte": -HUGE}}, "filter.must[0].range.lte"),
    ],
    ids=["match-value", "match-any", "range-gt", "range-lte"],
)
def test_a_filter_with_a_400_digit_number_is_a_422_naming_it(http, clause, names):
    """Issue 36, defect 3: 500 (OverflowError in kind_of)."""
    body = {"class": "7", "filter": {"must": [clause]}}
    _refused(http.post("/search", json=body), 422, names)


def test_an_attribute_of_400_digits_is_a_422_naming_it(http, digits):
    """Issue 36, defect 3: 500 (OverflowError in kind_of)."""
    version = _version(http)
    body = {"ids": ["big"], "instances": _images(digits, 1), "attributes": [{"big": HUGE}]}
    _refused(http.post(ITEMS, json=body, headers=AUTH), 422, "attributes[0]['big']")
    assert _version(http) == version


def _forged(**fields) -> str:
    """A cursor as the service writes one (URL-safe base64 of a JSON object), with ``fields``
    written into its JSON text as given."""
    document = {"c": '"x"', "v": "1", "s": '"0x0p+0"', "p": "0", "q": '"x"'}
    document.update(fields)
    text = "{" + ",".join(f'"{key}":{value}' for key, value in document.items()) + "}"
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "fields",
    [{"v": "1e400"}, {"p": "1e400"}, {"p": "Infinity"}, {"v": "NaN"}, {"p": "2.5"}],
    ids=["v-1e400", "p-1e400", "p-infinity", "v-nan", "p-fraction"],
)
def test_a_forged_cursor_of_huge_numbers_is_a_422(http, fields):
    """Issue 36, defect 3: 500 (int(inf) in Cursor.decode)."""
    body = {"class": "7", "cursor": _forged(**fields)}
    _refused(http.post("/search", json=body), 422, "cursor is not a cursor of this service")


# -- defects 8 and 9: ids numpy would change, ids a route could not name ----------------------


def test_an_id_with_a_nul_is_refused_never_changed(http, digits):
    """Issue 36, defect 8: "nul\\u0000" was stored as "nul"; ["z", "z\\u0000"] was "'z' is
    given twice"."""
    version = _version(http)
    for ids in (["nul\u0000"], ["z", "z\u0000"], ["in\u0000side"]):
        body = {"ids": ids, "instances": _images(digits, len(ids))}
        _refused(http.post(ITEMS, json=body, headers=AUTH), 422, "NUL")
    strings = {"ids": ["s"], "instances": _images(digits, 1), "attributes": [{"source": "a\0"}]}
    _refused(http.post(ITEMS, json=strings, headers=AUTH), 422, "NUL")
    assert _version(http) == version
    # An id with a NUL names no item, though numpy's strings would drop it: test-1 stays.
    assert http.get(f"{ITEMS}/{quote('test-1' + chr(0))}").status_code == 404
    deleted = http.post(f"{CATALOGUE}/delete", json={"ids": ["test-1\u0000"]}, headers=AUTH)
    assert deleted.json()["missing"] == ["test-1\u0000"]
    assert deleted.json()["deleted"] == 0
    assert http.get(f"{ITEMS}/test-1").status_code == 200
    excluded = http.post("/search", json={"class": "1", "exclude": ["test-1\u0000"]})
    _refused(excluded, 422, "unknown catalogue id")


def test_an_id_with_a_slash_can_be_fetched(http, digits):
    """Issue 36, defect 9: ids with "/" could be upserted, never fetched (404)."""
    ids = ["a/b", "/lead", "trail/", "a//b"]
    body = {"ids": ids, "instances": _images(digits, 4), "attributes": [{"source": "x"}] * 4}
    assert http.post(ITEMS, json=body, headers=AUTH).status_code == 200
    for item in ids:
        answer = http.get(f"{ITEMS}/{quote(item, safe='')}")
        assert answer.status_code == 200, (item, answer.text)
        assert answer.json()["id"] == item
        assert answer.json()["attributes"] == {"source": "x"}


# -- defect 12: near-duplicate positives and negatives ------------------------------------------


@pytest.mark.parametrize("factor", [1.0000001, 1.0001])
def test_near_duplicate_positives_and_negatives_are_refused(http, digits, factor):
    """Issue 36, defect 12: an instance against itself times 1.0000001 gave a code of 1.6e7."""
    image = digits.X_test[0].reshape(8, 8)
    body = {"positives": [image.tolist()], "negatives": [(image * factor).tolist()]}
    _refused(http.post("/search", json=body), 422, "nearly the same")
    # Examples that differ as items do are answered, their code of the usual size.
    other = digits.X_test[1].reshape(8, 8)
    body = {"positives": [image.tolist()], "negatives": [other.tolist()]}
    answer = http.post("/search", json=body)
    assert answer.status_code == 200, answer.text
    assert max(abs(v) for v in answer.json()["code"]["values"]) < 100


# -- defect 4: attribute keys without limit ---------------------------------------------------


def test_an_item_with_too_many_attribute_keys_is_a_422(http, digits):
    """Issue 36, defect 4: keys per item were unbounded."""
    version = _version(http)
    record = {f"k{j}": j for j in range(33)}
    body = {"ids": ["wide"], "instances": _images(digits, 1), "attributes": [record]}
    _refused(http.post(ITEMS, json=body, headers=AUTH), 422, "MAX_ITEM_ATTRIBUTES")
    assert _version(http) == version


def test_the_issues_upsert_of_20_000_distinct_keys_is_a_422_at_once(served_model, http, digits):
    """Issue 36, defect 4: 1,000 items of 20 distinct keys each answered 504 after 30 s,
    committed in the background (+167 MiB on disk in 20,000 files, RSS +370 MiB), and slowed
    every later upsert 30 times."""
    version = _version(http)
    before = sum(f.stat().st_size for f in catalogue_dir(served_model).rglob("*"))
    records = [{f"key-{i}-{j}": float(j) for j in range(20)} for i in range(1000)]
    body = {
        "ids": [f"keys-{i}" for i in range(1000)],
        "instances": _images(digits, 1000),
        "attributes": records,
    }
    started = time.monotonic()
    answer = http.post(ITEMS, json=body, headers=AUTH)
    _refused(answer, 422, "MAX_CATALOGUE_ATTRIBUTES")
    assert time.monotonic() - started < 20  # refused before any work, not after REQUEST_TIMEOUT
    time.sleep(1)
    assert _version(http) == version
    after = sum(f.stat().st_size for f in catalogue_dir(served_model).rglob("*"))
    assert after == before
    # A one-item upsert is as quick as ever, and the catalogue names the same attributes.
    small = {"ids": ["one"], "instances": _images(digits, 1), "attributes": [{"year": 2001}]}
    assert http.post(ITEMS, json=small, headers=AUTH).status_code == 200
    assert set(http.get(CATALOGUE).json()["attributes"]) == {"source", "weight", "year"}


def test_keys_beyond_the_catalogues_limit_are_a_422(attributed_model, digits, tmp_path):
    model = tmp_path / "digits"
    shutil.copytree(attributed_model, model)
    with (
        server_process(model, ADMIN_TOKEN=TOKEN, MAX_CATALOGUE_ATTRIBUTES="5") as running,
        httpx.Client(base_url=running.url, timeout=WAIT_S) as client,
    ):
        two = {"ids": ["two"], "instances": _images(digits, 1),
               "attributes": [{"colour": "red", "size": 3}]}  # fmt: skip
        assert client.post(ITEMS, json=two, headers=AUTH).status_code == 200  # 5 keys now
        three = {"ids": ["three"], "instances": _images(digits, 1),
                 "attributes": [{"shape": "round"}]}  # fmt: skip
        message = _refused(client.post(ITEMS, json=three, headers=AUTH), 422, "'shape'")
        assert "MAX_CATALOGUE_ATTRIBUTES" in message
        # Keys the catalogue has are always welcome.
        again = {"ids": ["again"], "instances": _images(digits, 1),
                 "attributes": [{"colour": "blue", "year": 1999}]}  # fmt: skip
        assert client.post(ITEMS, json=again, headers=AUTH).status_code == 200


def test_an_update_that_times_out_is_never_applied_later(attributed_model, digits, tmp_path):
    """Issue 36, defect 4: a 504 meant "done later": the update committed in the background.
    With REQUEST_TIMEOUT_S shorter than an update, each answer is a 200 (applied) or a 504
    (never applied, not even later)."""
    model = tmp_path / "digits"
    shutil.copytree(attributed_model, model)
    with (
        server_process(
            model, ADMIN_TOKEN=TOKEN, REQUEST_TIMEOUT_S="0.02", MAX_BATCH_SIZE="1000"
        ) as running,
        httpx.Client(base_url=running.url, timeout=WAIT_S) as client,
    ):
        # Updates of 1 to 1,000 items sent at once queue behind each other's commits: however
        # fast the machine, the last ones in the queue outlast 20 ms.
        def update(j: int, size: int) -> tuple[list[str], httpx.Response]:
            ids = [f"late-{j}-{i}" for i in range(size)]
            body = {"ids": ids, "instances": _images(digits, size, 0)}
            return ids, client.post(ITEMS, json=body, headers=AUTH)

        with ThreadPoolExecutor(16) as pool:
            sent = list(pool.map(update, range(16), [1, 10, 100, 1000] * 4))
        answers = {}
        for ids, answer in sent:
            assert answer.status_code in (200, 504), answer.text
            answers.update(dict.fromkeys(ids, answer.status_code))
            if answer.status_code == 504:
                assert "was not applied" in answer.json()["error"]["message"]
        time.sleep(2)  # what a background commit would need
        catalogue = read_catalogue(catalogue_dir(model), search_dir(model))
        applied = catalogue.lookup(list(answers)) >= 0
        assert list(applied) == [status == 200 for status in answers.values()]
        updates = {item.rsplit("-", 1)[0]: status for item, status in answers.items()}
        assert catalogue.version == 1 + sum(s == 200 for s in updates.values())
    assert 504 in answers.values(), "no update outlasted 20 ms: the test tested nothing"


def test_an_updates_work_is_counted_in_the_memory_budget(attributed_model, digits, tmp_path):
    """Issue 36, defect 4: the update's work was outside MAX_BUFFERED_BYTES: the issue's
    upsert (1,000 items of 20 keys of their own, 0.7 MiB of body) took 370 MiB of attribute
    columns, its body counted as 20 MB. Here the keys' limit is lifted, and the budget (64 MiB)
    refuses it before any of it is done."""
    model = tmp_path / "digits"
    shutil.copytree(attributed_model, model)
    records = [{f"key-{i}-{j}": float(j) for j in range(20)} for i in range(1000)]
    body = {
        "ids": [f"budget-{i}" for i in range(1000)],
        "instances": _images(digits, 1000),
        "attributes": records,
    }
    with server_process(
        model,
        ADMIN_TOKEN=TOKEN,
        MAX_BATCH_SIZE="1000",
        MAX_CATALOGUE_ATTRIBUTES="100000",
        MAX_BUFFERED_BYTES=str(64 * 2**20),
    ) as running:
        answer = httpx.post(f"{running.url}{ITEMS}", json=body, headers=AUTH, timeout=WAIT_S)
        _refused(answer, 413, "the update's work")
        assert "MAX_BUFFERED_BYTES" in answer.json()["error"]["message"]
        assert httpx.get(f"{running.url}{CATALOGUE}").json()["version"] == 1
        # The same items with the catalogue's own keys fit.
        body["attributes"] = [{"year": 2000 + i % 20} for i in range(1000)]
        answer = httpx.post(f"{running.url}{ITEMS}", json=body, headers=AUTH, timeout=WAIT_S)
        assert answer.status_code == 200, answer.text


# -- defect 5: a disk that fills up mid-update ---------------------------------------------------


@needs_namespaces
def test_an_upsert_on_a_nearly_full_disk_is_a_503_at_every_level(
    attributed_model, digits, tmp_path
):
    """Issue 36, defect 5: with 80-88 KiB free the shard was written but the version's
    tombstones or negatives file hit ENOSPC: 500. The server runs on a tmpfs of its own (a
    private mount namespace); the disk is filled to leave 0 to 160 KiB free, 4 KiB apart."""
    disk = tmp_path / "disk"
    disk.mkdir()
    script = (
        f'mount -t tmpfs -o size=8m tmpfs "{disk}" && cp -r "{attributed_model}" "{disk}/digits" '
        f'&& exec "{sys.executable}" -m service.api'
    )
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("MODEL_DIR", "MODEL_REPOSITORY")},
        "MODEL_DIR": str(disk / "digits"),
        "ADMIN_TOKEN": TOKEN,
        "ACCESS_LOG": "false",
    }
    command = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script]
    try:
        with start_server(command, env, ready_timeout=60, new_session=False) as running:
            # The server's view of its tmpfs, from outside its mount namespace.
            seen = Path(f"/proc/{running.process.pid}/root{disk}")
            filler = seen / "filler"
            statuses = []
            with httpx.Client(base_url=running.url, timeout=WAIT_S) as client:
                for j, free_kib in enumerate(range(0, 164, 4)):
                    filler.unlink(missing_ok=True)
                    stats = os.statvfs(seen)
                    free = stats.f_bavail * stats.f_frsize
                    with open(filler, "wb") as handle:
                        handle.truncate(0)
                        handle.write(b"\0" * max(0, free - free_kib * 1024))
                    body = {"ids": [f"full-{j}"], "instances": _images(digits, 1, j)}
                    answer = client.post(ITEMS, json=body, headers=AUTH)
                    statuses.append(answer.status_code)
                    assert answer.status_code in (200, 503), (free_kib, answer.text)
                    if answer.status_code == 503:
                        assert "No space left" in answer.json()["error"]["message"]
                    assert client.get("/readyz").status_code == 200
                filler.unlink()
                done = client.post(ITEMS, json={"ids": ["after"], "instances": _images(digits, 1)},
                                   headers=AUTH)  # fmt: skip
                assert done.status_code == 200, done.text
                assert client.get(f"{ITEMS}/after").status_code == 200
                search = client.post("/search", json={"class": "7", "top_k": 5})
                assert search.status_code == 200
            assert "Traceback" not in running.log()
    except ServerNotReady as error:
        pytest.fail(str(error))
    assert 503 in statuses, statuses
    assert 200 in statuses, statuses
