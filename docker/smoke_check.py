"""The docker smoke test's requests, sent from outside the container:
``python smoke_check.py URL [GRPC_ADDRESS]``, or ``python smoke_check.py --cluster-model NAME URL``
for the model the compose profile `cluster` trained, or ``python smoke_check.py --snapshot URL``
(the admin key in SMOKE_ADMIN_TOKEN) for a catalogue snapshot, whose name it prints last.

Checks the answers against scikit-learn's digits (the data set the trainer fitted: items 1000 on
are the held-out catalogue, ``test-<i>`` being item ``1000 + i``), not against the server's own
output. ``SMOKE_PROTOCOL=0`` skips the Open Inference Protocol (REST and gRPC) and /metrics checks
(for a branch that does not serve them yet). With GRPC_ADDRESS (host:port), tritonclient.grpc
classifies the same digit there, and its scores must equal the REST answer's. Exits non-zero
with a message on the first failed check.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request

import numpy as np
from prometheus_client.parser import text_string_to_metric_families
from sklearn.datasets import load_digits

TIMEOUT_S = 60
FIRST_HELD_OUT = 1000
# item 1,009 of the digits, a held-out 7: the README's example
KNOWN_ITEM = 1009


def request(
    base: str,
    path: str,
    body: dict | None = None,
    headers: dict | None = None,
    method: str | None = None,
) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    headers = {**({} if body is None else {"content-type": "application/json"}), **(headers or {})}
    req = urllib.request.Request(base + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def post_json(base: str, path: str, body: dict) -> dict:
    status, payload = request(base, path, body)
    check(status == 200, f"POST {path}: {status} {payload[:500]!r}")
    return json.loads(payload)


def check(condition: bool, message: str) -> None:
    if not condition:
        sys.exit(f"smoke check failed: {message}")


def check_grpc(address: str, image: np.ndarray, rest_scores: np.ndarray) -> None:
    """ModelInfer of ``image`` over gRPC: the label 7, the scores of the REST answer."""
    import tritonclient.grpc as grpcclient

    with grpcclient.InferenceServerClient(address) as client:
        check(client.is_server_ready(client_timeout=TIMEOUT_S), f"gRPC {address}: not ready")
        tensor = grpcclient.InferInput("input", [1, 8, 8, 1], "FP32")
        tensor.set_data_from_numpy(image.reshape(1, 8, 8, 1))
        result = client.infer("digits", [tensor], client_timeout=TIMEOUT_S)
    label = [value.decode() for value in result.as_numpy("label")]
    check(label == ["7"], f"gRPC ModelInfer label: {label}")
    scores = result.as_numpy("scores")
    check(np.array_equal(scores, rest_scores), f"gRPC scores {scores} != REST {rest_scores}")
    print(f"gRPC ModelInfer on {address}: label 7, scores equal to the REST answer's")


def main(base: str, grpc_address: str | None = None) -> None:
    digits = load_digits()
    truth = digits.target.astype(str)
    items = list(range(FIRST_HELD_OUT, FIRST_HELD_OUT + 10))

    answer = post_json(base, "/classify", {"instances": digits.images[items].tolist()})
    labels = [prediction["label"] for prediction in answer["predictions"]]
    right = sum(label == truth[i] for label, i in zip(labels, items, strict=True))
    check(labels[items.index(KNOWN_ITEM)] == "7", f"/classify: item {KNOWN_ITEM} is a 7: {labels}")
    check(right >= 8, f"/classify: {right}/10 held-out digits right: {labels}")
    print(f"/classify: 200, {right}/10 held-out digits right, item {KNOWN_ITEM} -> 7")

    answer = post_json(base, "/search", {"class": "7", "top_k": 3})
    ids = [result["id"] for result in answer["results"]]
    found = [truth[FIRST_HELD_OUT + int(item.removeprefix("test-"))] for item in ids]
    check(len(ids) == 3 and found == ["7"] * 3, f"/search class 7: {ids} are {found}")
    print(f"/search: 200, class 7 -> {ids}, all 7s")

    if os.environ.get("SMOKE_PROTOCOL", "1") == "0":
        print("SMOKE_PROTOCOL=0: /v2/models/digits/infer and /metrics not checked")
        return

    image = digits.images[KNOWN_ITEM].astype(np.float32)
    answer = post_json(
        base,
        "/v2/models/digits/infer",
        {
            "id": "smoke-1",
            "inputs": [
                {
                    "name": "input",
                    "datatype": "FP32",
                    "shape": [1, 8, 8, 1],
                    "data": image.ravel().tolist(),
                }
            ],
        },
    )
    outputs = {output["name"]: output for output in answer["outputs"]}
    check({"label", "scores"} <= outputs.keys(), f"/v2 infer outputs: {sorted(outputs)}")
    check(outputs["label"]["data"] == ["7"], f"/v2 infer label: {outputs['label']['data']}")
    scores = np.asarray(outputs["scores"]["data"], dtype=float).reshape(outputs["scores"]["shape"])
    check(scores.shape == (1, 10), f"/v2 infer scores shape {scores.shape}")
    print(f"/v2/models/digits/infer: 200, label 7, scores {list(scores.shape)}")
    if grpc_address is not None:
        check_grpc(grpc_address, image, scores)

    status, payload = request(base, "/metrics")
    check(status == 200, f"GET /metrics: {status}")
    families = [f.name for f in text_string_to_metric_families(payload.decode())]
    ours = [name for name in families if name.startswith("besvm_")]
    check(bool(ours), f"/metrics: no besvm_ metric among {families[:20]}")
    print(f"/metrics: 200, {len(ours)} besvm_ metric families")


def check_cluster_model(base: str, name: str, wait_s: float = 120.0) -> None:
    """Model ``name``, trained through the compose profile `cluster`, served once the API's
    rescan (RELOAD_INTERVAL_S) finds it: held-out digits classified as the default model is."""
    digits = load_digits()
    items = list(range(FIRST_HELD_OUT, FIRST_HELD_OUT + 10))
    body = {"instances": digits.images[items].tolist()}
    deadline = time.monotonic() + wait_s
    while True:
        status, payload = request(base, f"/v1/models/{name}/classify", body)
        if status == 200 or time.monotonic() > deadline:
            break
        time.sleep(2)
    check(status == 200, f"/v1/models/{name}/classify: {status} {payload[:500]!r}")
    labels = [prediction["label"] for prediction in json.loads(payload)["predictions"]]
    right = sum(label == str(digits.target[i]) for label, i in zip(labels, items, strict=True))
    check(labels[items.index(KNOWN_ITEM)] == "7", f"{name}: item {KNOWN_ITEM} is a 7: {labels}")
    check(right >= 8, f"{name}: {right}/10 held-out digits right: {labels}")
    print(f"/v1/models/{name}/classify: 200, {right}/10 held-out digits right")


def check_snapshot(base: str, token: str, wait_s: float = 120.0) -> None:
    """A snapshot of the digits catalogue through the API into its SNAPSHOTS_DIR (the compose
    file's `snapshots` volume), followed to its end if it answers 202; prints its name."""
    auth = {"authorization": f"Bearer {token}"}
    path = "/v1/models/digits/catalogue/snapshots"
    status, payload = request(base, path, headers=auth, method="POST")
    check(status in (201, 202), f"POST {path}: {status} {payload[:500]!r}")
    name = json.loads(payload)["name"]
    deadline = time.monotonic() + wait_s
    while True:
        status, payload = request(base, f"{path}/{name}", headers=auth)
        check(status == 200, f"GET {path}/{name}: {status} {payload[:500]!r}")
        record = json.loads(payload)
        if record["state"] != "in_progress" or time.monotonic() > deadline:
            break
        time.sleep(1)
    check(record["state"] == "done", f"snapshot {name}: {record}")
    print(f"{path}: {record['result']['n_files']} files of catalogue version "
          f"{record['result']['catalogue_version']}")  # fmt: skip
    print(name)


if __name__ == "__main__":
    if sys.argv[1] == "--cluster-model":
        check_cluster_model(sys.argv[3].rstrip("/"), sys.argv[2])
    elif sys.argv[1] == "--snapshot":
        check_snapshot(sys.argv[2].rstrip("/"), os.environ["SMOKE_ADMIN_TOKEN"])
    else:
        main(sys.argv[1].rstrip("/"), *sys.argv[2:3])
