"""The catalogue as a store people operate, through the HTTP API: a snapshot taken while
upserts and searches run (a real server, real HTTP), restored into a new server and into the
running one; a damaged snapshot refused naming the file; snapshots and restores that outlast
the request's time as jobs (202, their status, one at a time, failed or interrupted ones
reported, never a 504), and the command line's progress bars; batches of searches answered as
each query alone; counts and facets against a brute-force count; the routes' errors and their
OpenAPI examples. Real server processes for the main paths, an in-process client for errors."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import shutil
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from service.api import Settings, create_app
from service.api.jobs import SNAPSHOT, JobRecords
from service.model.search import catalogue_dir, search_dir
from service.model.search.snapshots import new_snapshot_name, snapshot_model_catalogue
from service.model.search.versions import catalogue_lock
from tests.api.conftest import server_process, serving
from tests.api.test_catalogue_api import (
    AUTH,
    TOKEN,
    WAIT_S,
    copy_with_catalogue,
    running,
    search_until,
    update_round,
)
from tests.catalogues import attributes_of

REPO = Path(__file__).resolve().parents[2]
# A code query of every item: its answer is exactly the live items of the version that answered.
EVERY_ITEM = {"code": {"indices": [3], "values": [1.0]}, "top_k": 1000}
SCANS = {"must": [{"key": "source", "match": {"value": "scan"}}]}
ROUNDS = 20


@pytest.fixture(scope="module")
def attributed_model(search_model_dir, digits, tmp_path_factory) -> Path:
    """The digits model, its catalogue of 797 items in 3 shards with attributes."""
    path = tmp_path_factory.mktemp("operations") / "digits"
    return copy_with_catalogue(search_model_dir, path, digits, 300, attributes_of(797))


def catalogue_of(url: str, http: httpx.Client) -> tuple[int, list[str]]:
    """The version a server answers from, and its live items in rank order."""
    body = http.post(f"{url}/search", json=EVERY_ITEM).json()
    return body["catalogue_version"], [hit["id"] for hit in body["results"]]


def snapshot_command(model: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "training", "index", "--model", str(model), *args],
        capture_output=True, text=True, timeout=WAIT_S, cwd=REPO,
    )  # fmt: skip


def flip_one_byte(file: Path) -> None:
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0x01
    os.chmod(file, 0o644)
    file.write_bytes(bytes(data))


def test_a_snapshot_taken_under_upserts_and_searches_restores_exactly_its_version(
    attributed_model, digits, tmp_path
):
    model = tmp_path / "digits"
    shutil.copytree(attributed_model, model)
    kept = tmp_path / "snapshots"
    live = {1: {f"test-{j}" for j in range(797)}}
    answers: list[tuple[int, list[str]]] = []
    failures: list[str] = []
    stop = threading.Event()

    def update(url: str) -> None:
        current = set(live[1])
        with httpx.Client(timeout=WAIT_S) as http:
            # Each round adds 8 live items: 20 rounds stay within EVERY_ITEM's top_k.
            for r in range(ROUNDS):
                if stop.is_set():
                    break
                update_round(url, http, digits, r, current, live)

    with serving(model, ADMIN_TOKEN=TOKEN, SNAPSHOTS_DIR=str(kept)) as url:
        workers = [
            threading.Thread(target=search_until, args=(url, EVERY_ITEM, stop, answers, failures))
            for _ in range(2)
        ]
        workers.append(threading.Thread(target=update, args=(url,)))
        with running(workers, stop), httpx.Client(timeout=WAIT_S) as http:
            deadline = time.monotonic() + WAIT_S
            while len(live) < 4:
                assert time.monotonic() < deadline, failures
                time.sleep(0.02)
            taken = http.post(f"{url}/v1/models/digits/catalogue/snapshots", headers=AUTH)
            assert taken.status_code == 201, taken.text
            assert taken.headers["location"].endswith(f"/snapshots/{taken.json()['name']}")
            # The command line, from another process, while the server writes.
            command = snapshot_command(model, "--snapshot", str(tmp_path / "by-command"))
            assert command.returncode == 0, command.stderr
            while len(live) < 2 * ROUNDS + 1:  # every round of updates done
                assert time.monotonic() < deadline, failures
                time.sleep(0.02)
        assert not failures
        ranked = dict(answers)
        snapshot = taken.json()
        version = snapshot["catalogue_version"]
        assert snapshot["n_items"] == len(live[version])
        assert max(live) > version + 2  # its files were removed from the catalogue meanwhile
        listed = httpx.get(f"{url}/v1/models/digits/catalogue/snapshots", headers=AUTH).json()
        assert [s["name"] for s in listed["snapshots"]] == [snapshot["name"]]

        # Restored into a new server (a copy of the model without its catalogue): exactly the
        # items of the version the snapshot names, ranked as that version ranked them.
        fresh = tmp_path / "fresh" / "digits"
        shutil.copytree(model, fresh, ignore=shutil.ignore_patterns("catalogue"))
        restored = snapshot_command(fresh, "--restore", str(kept / "digits" / snapshot["name"]))
        assert restored.returncode == 0, restored.stderr
        assert f"version {version}" in restored.stdout
        with serving(fresh) as new_url, httpx.Client(timeout=WAIT_S) as http:
            served, items = catalogue_of(new_url, http)
            assert served == version
            assert set(items) == live[version]
            assert len(items) == len(live[version])
            if version in ranked:
                assert items == ranked[version]
        command_version = int(command.stdout.split("catalogue version ")[1].split(",")[0])
        fresh_too = tmp_path / "fresh-too" / "digits"
        shutil.copytree(model, fresh_too, ignore=shutil.ignore_patterns("catalogue"))
        assert (
            snapshot_command(fresh_too, "--restore", str(tmp_path / "by-command")).returncode == 0
        )
        with serving(fresh_too) as new_url, httpx.Client(timeout=WAIT_S) as http:
            assert catalogue_of(new_url, http)[0] == command_version
            assert set(catalogue_of(new_url, http)[1]) == live[command_version]

        # Restored into the running server: a new version holding the snapshot's items.
        with httpx.Client(timeout=WAIT_S) as http:
            before = catalogue_of(url, http)[0]
            path = f"{url}/v1/models/digits/catalogue/snapshots/{snapshot['name']}/restore"
            answer = http.post(path, headers=AUTH)
            assert answer.status_code == 200, answer.text
            assert answer.json()["catalogue_version"] == before + 1
            assert answer.json()["n_items"] == len(live[version])
            served, items = catalogue_of(url, http)
            assert (served, set(items)) == (before + 1, live[version])

            # One byte changed: refused, the file named, nothing written.
            damaged = kept / "digits" / "damaged"
            shutil.copytree(kept / "digits" / snapshot["name"], damaged)
            shard = sorted((damaged / "catalogue" / "shards").glob("*/projected.npy"))[0]
            flip_one_byte(shard)
            refused = http.post(
                f"{url}/v1/models/digits/catalogue/snapshots/damaged/restore", headers=AUTH
            )
            assert refused.status_code == 409, refused.text
            assert refused.json()["error"]["type"] == "snapshot_refused"
            assert str(shard) in refused.json()["error"]["message"]
            assert catalogue_of(url, http)[0] == before + 1
    command = snapshot_command(fresh, "--restore", str(damaged))
    assert command.returncode != 0
    assert str(shard) in command.stderr
    assert "does not match its checksum" in command.stderr


SNAPSHOTS = "/v1/models/digits/catalogue/snapshots"


def _finished(http: httpx.Client, where: str) -> dict:
    """The status at ``where`` once its job is no longer in progress."""
    deadline = time.monotonic() + WAIT_S
    while True:
        status = http.get(where)
        assert status.status_code == 200, status.text
        if status.json()["state"] != "in_progress":
            return status.json()
        assert time.monotonic() < deadline, status.json()
        time.sleep(0.05)


def _refused_while_running(url: str, path: str, where: str) -> None:
    """A second job of the kind, on new connections (both worker processes), is refused and
    names the one running."""
    for _ in range(4):
        again = httpx.post(f"{url}{path}", headers=AUTH, timeout=WAIT_S)
        assert again.status_code == 409, again.text
        assert again.json()["error"]["type"] == "in_progress"
        assert where in again.json()["error"]["message"]
        assert again.headers["location"] == where


def test_snapshots_and_restores_past_the_requests_time_go_on_as_jobs_never_504(
    attributed_model, tmp_path
):
    """REQUEST_TIMEOUT_S of 1 s and the catalogue's writer lock held by this process (as an
    ``index --append`` elsewhere would): a snapshot and a restore answer 202 with their status
    route, a second one 409 from either worker process, and their status says done once the
    lock is let go; a snapshot whose process is killed reads interrupted, one that finds a
    damaged file failed (the file named), and neither leaves a directory under a snapshot's
    name. Nothing answers 504."""
    model = tmp_path / "digits"
    shutil.copytree(attributed_model, model)
    kept = tmp_path / "snapshots"
    settings = {"ADMIN_TOKEN": TOKEN, "SNAPSHOTS_DIR": str(kept), "REQUEST_TIMEOUT_S": "1"}
    statuses: list[int] = []
    with server_process(model, WORKERS="2", **settings) as server, httpx.Client(
        base_url=server.url, headers=AUTH, timeout=WAIT_S,
        event_hooks={"response": [lambda response: statuses.append(response.status_code)]},
    ) as http:  # fmt: skip
        version = http.get("/v1/models/digits/catalogue").json()["version"]
        # 1. A snapshot that cannot finish in time: 202, its status route, and it goes on.
        with catalogue_lock(search_dir(model)):
            started = http.post(SNAPSHOTS)
            assert started.status_code == 202, started.text
            name = started.json()["name"]
            where = f"{SNAPSHOTS}/{name}"
            assert started.headers["location"] == where
            assert started.json()["state"] == "in_progress"
            _refused_while_running(server.url, SNAPSHOTS, where)
            assert http.get(where).json()["state"] == "in_progress"
            assert http.get(SNAPSHOTS).json()["snapshots"] == []  # hidden until complete
            assert not (kept / "digits" / name).exists()
        done = _finished(http, where)
        assert done["state"] == "done", done
        assert done["result"]["name"] == name
        assert done["result"]["catalogue_version"] == version
        assert done["progress"] is None  # progress is for a job under way
        assert [s["name"] for s in http.get(SNAPSHOTS).json()["snapshots"]] == [name]
        # In time: 201 with the snapshot; wait=false: 202 at once, done soon after.
        quick = http.post(SNAPSHOTS)
        assert quick.status_code == 201, quick.text
        assert http.get(quick.headers["location"]).json()["result"] == quick.json()
        later = http.post(SNAPSHOTS, params={"wait": "false"})
        assert later.status_code == 202, later.text
        assert _finished(http, later.headers["location"])["state"] == "done"

        # 2. A restore that cannot finish in time: verified, then waits for the lock.
        restore = f"{SNAPSHOTS}/{name}/restore"
        with catalogue_lock(search_dir(model)):
            restoring = http.post(restore)
            assert restoring.status_code == 202, restoring.text
            assert restoring.headers["location"] == restore
            _refused_while_running(server.url, restore, restore)
            deadline = time.monotonic() + WAIT_S
            while (http.get(restore).json()["progress"] or {}).get("stage") != "restoring":
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert http.get("/v1/models/digits/catalogue").json()["version"] == version
        restored = _finished(http, restore)
        assert restored["state"] == "done", restored
        assert restored["result"]["catalogue_version"] == version + 1
        assert restored["result"]["snapshot"]["name"] == name
        deadline = time.monotonic() + WAIT_S  # the other worker: told by SIGHUP
        while {httpx.get(f"{server.url}/v1/models/digits/catalogue").json()["version"]
               for _ in range(6)} != {version + 1}:  # fmt: skip
            assert time.monotonic() < deadline
            time.sleep(0.1)

        # 3. A snapshot whose server is killed while it runs: interrupted, nothing kept.
        with server_process(model, **settings) as doomed, catalogue_lock(search_dir(model)):
            lost = httpx.post(f"{doomed.url}{SNAPSHOTS}", headers=AUTH, timeout=WAIT_S)
            assert lost.status_code == 202, lost.text
            doomed.process.send_signal(signal.SIGKILL)
            doomed.process.wait(WAIT_S)
        interrupted = http.get(lost.headers["location"]).json()
        assert interrupted["state"] == "failed", interrupted
        assert interrupted["error"]["type"] == "interrupted"
        assert not (kept / "digits" / lost.json()["name"]).exists()
        assert lost.json()["name"] not in {
            s["name"] for s in http.get(SNAPSHOTS).json()["snapshots"]
        }
        assert http.post(SNAPSHOTS).status_code == 201  # the lock went with the process
        assert not [p for p in (kept / "digits").iterdir() if ".tmp-" in p.name]  # cleared

        # 4. A snapshot that finds a file of the catalogue damaged (replaced by a changed copy
        # while it waited): failed, the file named, no snapshot under its name.
        shard = sorted(catalogue_dir(model).glob("shards/*/projected.npy"))[0]
        with catalogue_lock(search_dir(model)):
            failing = http.post(SNAPSHOTS)
            assert failing.status_code == 202, failing.text
            damaged = shard.with_name("damaged.npy")
            shutil.copyfile(shard, damaged)
            flip_one_byte(damaged)
            os.replace(damaged, shard)
        failed = _finished(http, failing.headers["location"])
        assert failed["state"] == "failed", failed
        assert str(shard) in failed["error"]["message"]
        assert "does not match its checksum" in failed["error"]["message"]
        assert not (kept / "digits" / failing.json()["name"]).exists()
        assert not [p for p in (kept / "digits").iterdir() if ".tmp-" in p.name]
        assert http.get(f"{SNAPSHOTS}/never-taken").status_code == 404
    assert 504 not in statuses
    assert statuses.count(202) == 4  # the killed server's is not among them


def test_a_finished_snapshot_reads_the_same_before_and_after_its_record_says_so(
    attributed_model, tmp_path
):
    """Regression: a snapshot renamed into place while its record still said in progress (the
    job's thread between the rename and the record) read done with progress null, and done with
    its last progress once the record said so; a status read in that window by CI's run saw the
    first. Now its state, result and progress read the same before and after, and a record
    written done with its progress (by a server before the fix) reads progress null too."""
    model = tmp_path / "digits"
    shutil.copytree(attributed_model, model)
    kept = tmp_path / "snapshots"
    settings = {"ADMIN_TOKEN": TOKEN, "SNAPSHOTS_DIR": str(kept)}
    with server_process(model, **settings) as server, httpx.Client(
        base_url=server.url, headers=AUTH, timeout=WAIT_S
    ) as http:  # fmt: skip
        version = http.get("/v1/models/digits/catalogue").json()["version"]
        # The window, held open: this process claims a job, its directory completes, and its
        # record says in progress until the claim finishes.
        records = JobRecords(kept / "digits", "digits")
        name = new_snapshot_name()
        claim = records.claim(SNAPSHOT, name)
        try:
            snapshot_model_catalogue(model, kept / "digits" / name, claim)
            assert records.status(SNAPSHOT, name)["state"] == "in_progress"
            assert claim.current()["progress"]["files_done"] > 0
            before = http.get(f"{SNAPSHOTS}/{name}").json()
            listed = http.get(SNAPSHOTS).json()["snapshots"]
        finally:
            claim.finish({"name": name, "from": "the test's claim"}, None)
        after = http.get(f"{SNAPSHOTS}/{name}").json()
        # A record written done with its last progress, as the server wrote them before.
        old = {**after, "progress": {"stage": "copying", "files_done": 3, "n_files": 3,
                                     "bytes_done": 9, "n_bytes": 9}}  # fmt: skip
        records.write(SNAPSHOT, name, old, durable=False)
        rewritten = http.get(f"{SNAPSHOTS}/{name}").json()
    assert before["state"] == after["state"] == rewritten["state"] == "done", (before, after)
    assert before["progress"] is None, before
    assert after["progress"] is None, after
    assert rewritten["progress"] is None, rewritten
    # Before the record: the snapshot's directory answered (the list reads it too).
    assert before["result"]["name"] == name
    assert before["result"]["catalogue_version"] == version
    assert [entry["name"] for entry in listed] == [name]
    assert after["result"] == {"name": name, "from": "the test's claim"}  # the record's word


def test_the_command_line_shows_progress_on_a_terminal_only(attributed_model, tmp_path):
    """``index --snapshot`` and ``--restore`` draw a bar per stage (bytes, files beside) on a
    terminal, as the other long commands; nothing with --quiet, nor when not a terminal."""

    model = tmp_path / "digits"
    shutil.copytree(attributed_model, model)

    def on_a_terminal(model: Path, *args: str) -> str:
        leader, follower = pty.openpty()
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        run = subprocess.Popen(
            [sys.executable, "-m", "training", "index", "--model", str(model), *args],
            stdout=subprocess.DEVNULL, stderr=follower, cwd=REPO,
        )  # fmt: skip
        os.close(follower)
        written = b""
        with contextlib.suppress(OSError):  # EIO once the command has ended
            while chunk := os.read(leader, 4096):
                written += chunk
        os.close(leader)
        assert run.wait(WAIT_S) == 0, written
        return written.decode(errors="replace")

    shown = on_a_terminal(model, "--snapshot", str(tmp_path / "taken"))
    assert "copying: 100%" in shown
    n_files = sum(f.is_file() for f in (tmp_path / "taken" / "catalogue").rglob("*"))
    assert f"{n_files}/{n_files} files" in shown
    fresh = tmp_path / "fresh"
    shutil.copytree(model, fresh, ignore=shutil.ignore_patterns("catalogue"))
    shown = on_a_terminal(fresh, "--restore", str(tmp_path / "taken"))
    assert "verifying: 100%" in shown
    assert "restoring: 100%" in shown
    assert "%|" not in on_a_terminal(model, "--snapshot", str(tmp_path / "quiet"), "--quiet")
    piped = snapshot_command(model, "--snapshot", str(tmp_path / "piped"))
    assert piped.returncode == 0, piped.stderr
    assert piped.stderr == ""  # not a terminal: no bar


def test_batches_counts_and_facets_through_the_server(attributed_model):
    records = attributes_of(797)
    searches = [
        {"class": "7", "top_k": 20},
        {"code": {"indices": [3, 11, 50], "values": [1.0, -0.5, 0.25]}, "top_k": 797},
        {"positives": ["test-3", "test-40"], "top_k": 25},
        {"class": "9", "top_k": 15, "filter": SCANS, "exclude": ["test-8"]},
        {"class": "2", "top_k": 10, "offset": 290},
        {"class": "4", "top_k": 5, "strongest_atoms": 2},
    ]
    with serving(attributed_model) as url, httpx.Client(timeout=WAIT_S) as http:
        alone = [http.post(f"{url}/search", json=query).json() for query in searches]
        batch = http.post(f"{url}/v1/models/digits/search", json={"searches": searches})
        assert batch.status_code == 200, batch.text
        assert batch.json()["searches"] == alone  # each answer exactly as alone
        cursor = alone[0]["next_cursor"]
        paged = http.post(f"{url}/search", json={"searches": [{**searches[0], "cursor": cursor}]})
        assert (
            paged.json()["searches"][0]
            == http.post(f"{url}/search", json={**searches[0], "cursor": cursor}).json()
        )

        count = http.post(f"{url}/v1/models/digits/catalogue/count", json={"filter": SCANS})
        assert count.json()["count"] == sum(r.get("source") == "scan" for r in records)
        assert http.post(f"{url}/v1/models/digits/catalogue/count", json={}).json()["count"] == 797
        facet = http.post(f"{url}/v1/models/digits/catalogue/facet",
                          json={"key": "year", "limit": 4, "filter": SCANS}).json()  # fmt: skip
        years: dict[float, int] = {}
        for record in records:
            if record.get("source") == "scan":
                years[float(record["year"])] = years.get(float(record["year"]), 0) + 1
        expected = sorted(years.items(), key=lambda item: (-item[1], item[0]))[:4]
        assert [(hit["value"], hit["count"]) for hit in facet["hits"]] == expected
        assert facet["n_values"] == len(years)


@pytest.fixture
def client(attributed_model, tmp_path):
    copy = tmp_path / "digits"
    shutil.copytree(attributed_model, copy)
    settings = Settings(_env_file=None, model_dir=copy, admin_token=TOKEN, max_batch_size=50,
                        max_search_top_k=100, max_search_offset=200,
                        snapshots_dir=tmp_path / "snapshots")  # fmt: skip
    with TestClient(create_app(settings), raise_server_exceptions=False) as test_client:
        yield test_client


def _error(response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"searches": []}, 422, "searches is empty"),
        ({"searches": [{"class": "7"}] * 51}, 413, "51 searches; the limit is 50"),
        ({"searches": [{"class": "7", "top_k": 100, "offset": 200}] * 2}, 413, "rank 600 items"),
        ({"searches": [{"class": "7"}, {"class": "7", "top_k": 101}]}, 422,
         "searches[1]: top_k must be at most 100"),
        ({"searches": [{"class": "7"}, {"class": "7", "offset": 201}]}, 422, "searches[1]: offset"),
        ({"searches": [{"class": "7"}, {"class": "x"}]}, 422, "searches[1]: unknown class 'x'"),
        ({"searches": [{"class": "7"}, {"code": {"indices": [1], "values": [1.0]},
                                         "class": "7"}]}, 422, "searches[1]: send exactly one"),
        ({"searches": [{"class": "7"}, {"classs": "7"}]}, 422, "searches[1].classs"),
        ({"searches": [{"positives": ["test-1"] * 30}, {"positives": ["test-2"] * 30}]}, 413,
         "60 positives and negatives in all; the limit is 50"),
        ({"searches": {"class": "7"}}, 422, "searches"),
    ],
)  # fmt: skip
def test_bad_batches_get_a_clear_4xx(client, body, status, message):
    assert message in _error(client.post("/search", json=body), status)["message"]


def test_count_facet_and_snapshot_routes_refuse_clearly(client, tmp_path):
    count = "/v1/models/digits/catalogue/count"
    facet = "/v1/models/digits/catalogue/facet"
    unknown = {"must": [{"key": "colour", "match": {"value": "red"}}]}
    for route, body, message in [
        (count, {"filter": unknown}, "unknown attribute 'colour'"),
        (facet, {"key": "colour"}, "unknown attribute 'colour'"),
        (facet, {"key": "year", "limit": 1001}, "limit must be at most 1000"),
        (facet, {"key": "year", "limit": 0}, "limit must be at least 1"),
        (facet, {}, "key"),
    ]:
        assert message in _error(client.post(route, json=body), 422)["message"]
    snapshots = "/v1/models/digits/catalogue/snapshots"
    assert _error(client.post(snapshots), 401)
    assert _error(client.get(snapshots), 401)
    assert _error(client.post(f"{snapshots}/x/restore"), 401)
    missing = client.post(f"{snapshots}/nope/restore", headers=AUTH)
    assert "no catalogue snapshot" in _error(missing, 404)["message"]
    assert _error(client.post(f"{snapshots}/..%2F..%2Fetc/restore", headers=AUTH), 404)
    assert _error(client.post("/v1/models/nope/catalogue/snapshots", headers=AUTH), 404)
    settings = Settings(_env_file=None, model_dir=tmp_path / "digits", admin_token=TOKEN)
    with TestClient(create_app(settings), raise_server_exceptions=False) as no_dir:
        refused = _error(no_dir.post(snapshots, headers=AUTH), 404)
        assert "SNAPSHOTS_DIR" in refused["message"]


def test_the_openapi_examples_of_the_new_routes_answer(client):
    spec = client.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    routes = {
        "SearchBatchRequest": "/search",
        "CountRequest": "/v1/models/digits/catalogue/count",
        "FacetRequest": "/v1/models/digits/catalogue/facet",
    }
    for schema, route in routes.items():
        examples = schemas[schema]["examples"]
        assert examples, schema
        for example in examples:
            response = client.post(route, json=example)
            assert response.status_code == 200, (schema, example, response.text)
    body = spec["paths"]["/search"]["post"]["requestBody"]["content"]["application/json"]
    assert {"$ref": "#/components/schemas/SearchBatchRequest"} in body["schema"]["oneOf"]
    assert schemas["SearchBatchRequest"]["properties"]["searches"]["maxItems"] == 50
    for path in ("/v1/models/{name}/catalogue/snapshots",
                 "/v1/models/{name}/catalogue/snapshots/{snapshot}",
                 "/v1/models/{name}/catalogue/snapshots/{snapshot}/restore"):  # fmt: skip
        for operation in spec["paths"][path].values():
            assert "403" in operation["responses"]  # admin routes
            assert "504" not in operation["responses"]  # jobs: 202 when past the time
    snapshots = spec["paths"]["/v1/models/{name}/catalogue/snapshots"]["post"]
    restore = spec["paths"]["/v1/models/{name}/catalogue/snapshots/{snapshot}/restore"]
    assert {"201", "202", "409"} <= set(snapshots["responses"])
    assert {"200", "202", "409"} <= set(restore["post"]["responses"])
    assert restore["get"]["operationId"] != restore["post"]["operationId"]
