"""Planning and idempotency keys: the same row gives the same key anywhere; a changed row, new keys."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from PIL import Image

from imagebatch.gateway.constants import Route
from imagebatch.manifest import (
    Job,
    Turn,
    canonical_json,
    idempotency_key,
    key_material,
    load_manifest,
    plan,
    request_parameters,
    summarise,
    summarise_jobs,
    variant_of,
)

KEY = re.compile(r"ib1-[0-9a-f]{32}")

CATALOG = (
    "id,sku,product_name,colour,aspect_ratio,prompt,reference_images\n"
    "mug,S1,mug,blue,1:1,Photo of a {product_name} in {colour},images/a.png\n"
    "bowl,S2,bowl,red,,Photo of a {product_name} in {colour},images/b.png\n"
    "vase,S3,vase,white,9:16,Photo of a {product_name} in {colour},\n"
)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "images").mkdir(parents=True)
    Image.new("RGB", (16, 16), (255, 0, 0)).save(root / "images" / "a.png")
    Image.new("RGB", (16, 16), (0, 0, 255)).save(root / "images" / "b.png")
    (root / "m.csv").write_text(CATALOG)
    return root


def keys_of(path: Path) -> dict[tuple[str, int, int], str]:
    return {(r.job_id, r.request_index, r.turn_index): r.idempotency_key for r in plan(load_manifest(path))}


def changed(before: dict[tuple[str, int, int], str], after: dict[tuple[str, int, int], str]) -> set[str]:
    return {k[0] for k in before.keys() | after.keys() if before.get(k) != after.get(k)}


def test_keys_look_right_and_are_unique(project: Path) -> None:
    keys = keys_of(project / "m.csv")
    assert all(KEY.fullmatch(k) for k in keys.values())
    assert len(set(keys.values())) == len(keys) == 3


def test_same_manifest_in_another_folder_gives_the_same_keys(project: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "somewhere" / "else"
    shutil.copytree(project, elsewhere)
    assert keys_of(project / "m.csv") == keys_of(elsewhere / "m.csv")


def test_touching_files_changes_nothing(project: Path) -> None:
    before = keys_of(project / "m.csv")
    for path in [project / "m.csv", *(project / "images").iterdir()]:
        os.utime(path, (1, 1))
    assert keys_of(project / "m.csv") == before


def test_changing_one_row_changes_only_its_keys(project: Path) -> None:
    before = keys_of(project / "m.csv")
    (project / "m.csv").write_text(CATALOG.replace("bowl,S2,bowl,red", "bowl,S2,bowl,green"))
    assert changed(before, keys_of(project / "m.csv")) == {"bowl"}


def test_changing_image_bytes_changes_the_keys_of_its_jobs(project: Path) -> None:
    before = keys_of(project / "m.csv")
    Image.new("RGB", (16, 16), (0, 255, 0)).save(project / "images" / "a.png")
    assert changed(before, keys_of(project / "m.csv")) == {"mug"}


def test_renaming_an_image_changes_nothing(project: Path) -> None:
    before = keys_of(project / "m.csv")
    (project / "images" / "a.png").rename(project / "images" / "renamed.png")
    (project / "m.csv").write_text(CATALOG.replace("images/a.png", "images/renamed.png"))
    assert keys_of(project / "m.csv") == before


def test_metadata_and_row_order_do_not_enter_keys(project: Path) -> None:
    before = keys_of(project / "m.csv")
    header, *rows = CATALOG.splitlines()
    reordered = "\n".join([header.replace("sku,", "sku,"), *reversed(rows)]) + "\n"
    (project / "m.csv").write_text(reordered.replace(",S2,", ",S2-renumbered,"))
    assert keys_of(project / "m.csv") == before


def test_metadata_reaching_the_prompt_changes_the_key(project: Path) -> None:
    before = keys_of(project / "m.csv")
    (project / "m.csv").write_text(CATALOG.replace(",vase,white,", ",vase,ivory,"))
    assert changed(before, keys_of(project / "m.csv")) == {"vase"}


def test_defaults_written_or_not_give_the_same_key(project: Path) -> None:
    (project / "explicit.csv").write_text(
        "id,prompt,model,route,aspect_ratio,image_size,max_images,count\nj,x,native-image-2.1,native,1:1,1K,1,1\n"
    )
    (project / "implicit.csv").write_text(
        "id,prompt,model,route,aspect_ratio,image_size,max_images,count\nj,x,,,,,,\n"
    )
    assert keys_of(project / "explicit.csv") == keys_of(project / "implicit.csv")


def test_windows_line_endings_give_the_same_keys(project: Path) -> None:
    (project / "lf.csv").write_bytes(b'id,prompt\nj,"two\nlines"\n')
    (project / "crlf.csv").write_bytes(b'id,prompt\r\nj,"two\r\nlines"\r\n')
    assert keys_of(project / "lf.csv") == keys_of(project / "crlf.csv")


def test_csv_and_json_of_the_same_jobs_give_the_same_keys(project: Path) -> None:
    jobs = [
        {"id": "mug", "sku": "S1", "prompt": "Photo of a mug in blue", "reference_images": ["images/a.png"]},
        {"id": "bowl", "prompt": "Photo of a bowl in red", "reference_images": ["images/b.png"]},
        {"id": "vase", "prompt": "Photo of a vase in white", "aspect_ratio": "9:16"},
    ]
    (project / "m.json").write_text(json.dumps(jobs))
    (project / "m.jsonl").write_text("\n".join(json.dumps(j) for j in jobs))
    assert keys_of(project / "m.csv") == keys_of(project / "m.json") == keys_of(project / "m.jsonl")


def test_raising_count_keeps_existing_keys(project: Path) -> None:
    (project / "c.csv").write_text("id,prompt,count\nj,x,2\n")
    two = keys_of(project / "c.csv")
    (project / "c.csv").write_text("id,prompt,count\nj,x,3\n")
    three = keys_of(project / "c.csv")
    assert two.items() <= three.items()
    assert len(three) == 3


def test_chains_plan_every_turn_and_keep_earlier_keys(project: Path) -> None:
    chain = {"id": "c", "prompt": "x", "reference_images": ["images/a.png"], "count": 2, "turns": ["warmer"]}
    (project / "c.json").write_text(json.dumps([chain]))
    requests = list(plan(load_manifest(project / "c.json")))
    assert [(r.request_index, r.turn_index) for r in requests] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [r.prompt for r in requests] == ["x", "warmer", "x", "warmer"]
    assert requests[0].reference_images == [(project / "images" / "a.png").resolve()]
    assert requests[1].reference_images == [] and requests[1].mask is None
    before = {(r.request_index, r.turn_index): r.idempotency_key for r in requests}

    chain["turns"] = ["warmer", {"prompt": "add badge", "reference_images": ["images/b.png"]}]
    (project / "c.json").write_text(json.dumps([chain]))
    after = {
        (r.request_index, r.turn_index): r.idempotency_key for r in plan(load_manifest(project / "c.json"))
    }
    assert before.items() <= after.items()
    assert len(after) == 6

    chain["turns"] = ["cooler", chain["turns"][1]]
    (project / "c.json").write_text(json.dumps([chain]))
    edited = {
        (r.request_index, r.turn_index): r.idempotency_key for r in plan(load_manifest(project / "c.json"))
    }
    # Editing turn 1 keeps turn 0's key and changes turn 1's and every later turn's (they build on it).
    assert [edited[k] == after[k] for k in sorted(after)] == [True, False, False, True, False, False]


def test_key_material_holds_no_paths(project: Path) -> None:
    job = load_manifest(project / "m.csv").jobs[0]
    text = canonical_json(key_material(job, 0)).decode()
    assert str(project) not in text and "a.png" not in text
    assert job.reference_sha256[0] in text


def test_golden_key() -> None:
    # A fixed job with a fixed key: a change here changes every key users have. Bump RECIPE_VERSION then.
    job = Job(
        id="sku-1",
        line=2,
        location="line 2",
        prompt="Studio photo of a mug",
        model="native-image-2.1",
        route="native",
        aspect_ratio="1:1",
        image_size="1K",
        reference_images=[Path("/anywhere/a.png")],
        reference_sha256=["0" * 64],
        max_images=1,
        turns=[Turn(prompt="warmer", reference_images=[], reference_sha256=[])],
        metadata={"sku": "ignored"},
    )
    assert key_material(job, 0, 1) == {
        "recipe": "ib1",
        "route": "native",
        "model": "native-image-2.1",
        "parameters": {"aspect_ratio": "1:1", "image_size": "1K", "max_images": 1},
        "prompt": "Studio photo of a mug",
        "reference_sha256": ["0" * 64],
        "mask_sha256": None,
        "job_id": "sku-1",
        "request_index": 0,
        "turn_index": 1,
        "turns": [{"prompt": "warmer", "reference_sha256": []}],
    }
    assert idempotency_key(job, 0, 0) == "ib1-40e517cdf1d3b8bfa11dcc617269c348"
    assert idempotency_key(job, 0, 1) == "ib1-44f0cbf7134ca9bfcf7b11e981bda250"
    with pytest.raises(ValueError):
        idempotency_key(job, 1, 0)
    with pytest.raises(ValueError):
        idempotency_key(job, 0, 2)


def test_variant_keys_add_the_variant_and_leave_first_samples_alone(project: Path) -> None:
    job = load_manifest(project / "m.csv").jobs[0]
    material = key_material(job, 0)
    assert "variant" not in material and key_material(job, 0, 0, 1) == material  # old folders keep their keys
    assert key_material(job, 0, 0, 2) == {**material, "variant": 2}
    first = next(plan(load_manifest(project / "m.csv")))
    second, third = variant_of(first, 2), variant_of(first, 3)
    assert variant_of(first, 1) == first and variant_of(third, 2) == second  # from any variant, the same
    assert len({first.idempotency_key, second.idempotency_key, third.idempotency_key}) == 3
    assert (second.variant, second.idempotency_key) == (2, idempotency_key(job, 0, 0, 2))
    assert KEY.fullmatch(second.idempotency_key)
    with pytest.raises(ValueError):
        idempotency_key(job, 0, 0, 0)


def test_golden_variant_keys() -> None:
    # As test_golden_key: a change here changes the key of every variant users have made.
    job = Job(
        id="sku-1", line=2, location="line 2", prompt="Studio photo of a mug", model="native-image-2.1",
        route="native", aspect_ratio="1:1", image_size="1K", reference_images=[Path("/anywhere/a.png")],
        reference_sha256=["0" * 64], max_images=1,
        turns=[Turn(prompt="warmer", reference_images=[], reference_sha256=[])],
    )  # fmt: skip
    assert idempotency_key(job, 0, 0, 1) == "ib1-40e517cdf1d3b8bfa11dcc617269c348"
    assert idempotency_key(job, 0, 0, 2) == "ib1-a9564ff078070a4b0fe669f6d5c9337e"
    assert idempotency_key(job, 0, 1, 2) == "ib1-d49b9f5364845dbe07adab18db2621a9"


def test_plan_keys_match_idempotency_key(project: Path) -> None:
    (project / "c.json").write_text(json.dumps([{"id": "c", "prompt": "x", "count": 2, "turns": ["a", "b"]}]))
    manifest = load_manifest(project / "c.json")
    for request in plan(manifest):
        assert request.idempotency_key == idempotency_key(
            request.job, request.request_index, request.turn_index
        )


# --- plan and summary ---------------------------------------------------------------------------------


def mixed(project: Path) -> Path:
    Image.new("RGBA", (16, 16), (0, 0, 0, 0)).save(project / "images" / "mask.png")
    Image.new("RGBA", (16, 16), (9, 9, 9, 255)).save(project / "images" / "room.png")
    jobs = [
        {"id": "gen", "prompt": "x", "count": 2, "max_images": 3},
        {"id": "edit", "prompt": "x", "reference_images": ["images/a.png"], "turns": ["y", "z"]},
        {"id": "chat", "route": "chat", "model": "native-image-pro", "prompt": "x", "max_images": 2},
        {"id": "img-gen", "model": "compat-image-2", "prompt": "x", "count": 3},
        {"id": "img-edit", "prompt": "x", "route": "images", "reference_images": ["images/room.png"],
         "mask": "images/mask.png"},
        {"id": "msg", "route": "messages", "model": "claude-compat-small", "prompt": "x", "count": 2},
        {"id": "resp", "route": "responses", "model": "gpt-compat-mini", "prompt": "x"},
    ]  # fmt: skip
    (project / "mixed.json").write_text(json.dumps(jobs))
    return project / "mixed.json"


def test_plan_routes_and_images(project: Path) -> None:
    requests = list(plan(load_manifest(mixed(project))))
    by_job: dict[str, list[tuple[Route, int]]] = {}
    for r in requests:
        by_job.setdefault(r.job_id, []).append((r.route, r.images_at_most))
    assert by_job == {
        "gen": [(Route.NATIVE, 3)] * 2,
        "edit": [(Route.NATIVE, 1)] * 3,
        "chat": [(Route.CHAT, 2)],
        "img-gen": [(Route.IMAGES_GENERATIONS, 1)] * 3,
        "img-edit": [(Route.IMAGES_EDITS, 1)],
        "msg": [(Route.MESSAGES, 0)] * 2,
        "resp": [(Route.RESPONSES, 0)],
    }
    edit = next(r for r in requests if r.job_id == "img-edit")
    assert edit.mask == (project / "images" / "mask.png").resolve()
    assert edit.job.mask_sha256 is not None


def test_summary(project: Path) -> None:
    manifest = load_manifest(mixed(project))
    summary = summarise(plan(manifest))
    assert summarise_jobs(manifest.jobs) == summary  # what validate prints, counted without the keys
    assert (summary.jobs, summary.requests, summary.images_at_most) == (7, 13, 15)
    by_route = {
        route.value: (c.jobs, c.requests, c.images_at_most)
        for (route, _), c in summary.by_route_model.items()
    }
    assert by_route == {  # one model per route here
        "native": (2, 5, 9),
        "chat": (1, 1, 2),
        "images_generations": (1, 3, 3),
        "images_edits": (1, 1, 1),
        "messages": (1, 2, 0),
        "responses": (1, 1, 0),
    }
    assert summary.by_model["compat-image-2"].requests == 4
    assert summary.table().splitlines() == [
        "route               model                jobs  requests  images at most",
        "native              native-image-2.1        2         5               9",
        "chat                native-image-pro        1         1               2",
        "images_generations  compat-image-2          1         3               3",
        "images_edits        compat-image-2          1         1               1",
        "messages            claude-compat-small     1         2               0",
        "responses           gpt-compat-mini         1         1               0",
        "total                                       7        13              15",
    ]


def test_a_large_plan_shares_what_its_rows_repeat(tmp_path: Path) -> None:
    """The plan is kept for a whole run: values that repeat across rows are one object, not one per row."""
    path = tmp_path / "m.csv"
    path.write_text(
        "id,prompt,image_size,aspect_ratio\n" + "".join(f"r{i},p {i},2K,16:9\n" for i in range(3))
    )
    first, _, last = load_manifest(path).jobs
    assert (first.image_size, first.aspect_ratio) == (last.image_size, last.aspect_ratio) == ("2K", "16:9")
    assert first.image_size is last.image_size and first.aspect_ratio is last.aspect_ratio
    assert first.model is last.model and first.__pydantic_fields_set__ is last.__pydantic_fields_set__
    assert first.prompt == "p 0" and last.prompt == "p 2"


def test_each_route_gets_its_own_parameters_defaults_filled_once(tmp_path: Path) -> None:
    jobs = [
        {"id": "n", "prompt": "x"},
        {"id": "c", "prompt": "x", "route": "chat", "image_size": "2K"},
        {"id": "i", "prompt": "x", "route": "images"},
        {"id": "m", "prompt": "x", "route": "messages", "model": "claude-compat-small"},
        {"id": "r", "prompt": "x", "route": "responses", "model": "gpt-compat-mini"},
    ]
    (tmp_path / "m.json").write_text(json.dumps(jobs))
    params = ("aspect_ratio", "image_size", "size", "max_images", "max_tokens")
    found = {job.id: {p: getattr(job, p) for p in params} for job in load_manifest(tmp_path / "m.json").jobs}
    image = {"aspect_ratio": "1:1", "image_size": "1K", "size": None, "max_images": 1, "max_tokens": None}
    nothing = dict.fromkeys(params)
    assert found == {
        "n": image,
        "c": {**image, "image_size": "2K"},
        "i": {**nothing, "size": "1024x1024"},
        "m": {**nothing, "max_tokens": 1024},
        "r": nothing,
    }
    for request in plan(load_manifest(tmp_path / "m.json")):
        sent = {p: getattr(request, p) for p in request_parameters(request.job)}
        assert sent == key_material(request.job, 0)["parameters"]  # what is sent is what is hashed


def test_a_checked_job_is_what_pydantic_makes_of_its_values(project: Path) -> None:
    for job in load_manifest(mixed(project)).jobs:
        values = dict(job.__dict__)
        validated = Job(**values)
        assert job == validated == Job.model_construct(set(Job.model_fields), **values)
        assert job.model_dump() == validated.model_dump() and list(job.model_dump()) == list(Job.model_fields)
        assert job.model_fields_set == set(Job.model_fields)
        assert repr(job) == repr(validated)
