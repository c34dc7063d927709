"""The shipped manifests parse, and every kustomization's references resolve."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3] / "deploy" / "kustomize"
KUSTOMIZATIONS = sorted(ROOT.rglob("kustomization.yaml"))


def test_every_manifest_parses() -> None:
    files = sorted(ROOT.rglob("*.yaml"))
    assert files
    for f in files:
        docs = [d for d in yaml.safe_load_all(f.read_text()) if d]
        assert docs, f
        for doc in docs:
            assert "apiVersion" in doc and "kind" in doc, f


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS, ids=lambda p: str(p.relative_to(ROOT)))
def test_kustomization_references_resolve(kustomization: Path) -> None:
    doc = yaml.safe_load(kustomization.read_text())
    for ref in doc.get("resources", []):
        target = (kustomization.parent / ref).resolve()
        if target.is_dir():
            assert (target / "kustomization.yaml").exists(), f"{kustomization}: {ref}"
        else:
            assert target.is_file(), f"{kustomization}: {ref} missing"


def test_every_crd_is_listed_and_structural() -> None:
    crd_dir = ROOT / "crds"
    listed = set(yaml.safe_load((crd_dir / "kustomization.yaml").read_text())["resources"])
    for f in crd_dir.glob("*.yaml"):
        if f.name == "kustomization.yaml":
            continue
        assert f.name in listed, f"{f.name} not in crds/kustomization.yaml"
        crd = yaml.safe_load(f.read_text())
        assert crd["kind"] == "CustomResourceDefinition"
        for version in crd["spec"]["versions"]:
            assert version["schema"]["openAPIV3Schema"]["type"] == "object", f.name
