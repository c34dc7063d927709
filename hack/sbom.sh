#!/usr/bin/env bash
# The software bill of materials of every image: one CycloneDX 1.5 document per service, from
# exactly what its Dockerfile installs (`uv sync --frozen --package <service> --no-dev`: the
# lock's packages for it, with their versions, purls and distribution hashes), written to
# build/sbom/<service>.cdx.json and checked (each names its service and every package the
# lock resolves for it). The Python base image's own packages are not in it.
set -euo pipefail
cd "$(dirname "$0")/.."
read -ra UV <<< "${UV:-uv}"  # (a command: `python3 -m uv` from the Makefile)
OUT="${SBOM_DIR:-build/sbom}"
mkdir -p "$OUT"
for dir in services/*/; do
  service=$(basename "$dir")
  package="alnair-$service"
  out="$OUT/$service.cdx.json"
  # (the CycloneDX export is a preview feature of uv 0.13: named so it does not warn)
  "${UV[@]}" export --frozen --package "$package" --no-dev --format cyclonedx1.5 \
      --preview-features sbom-export -o "$out" >/dev/null 2>&1 \
    || "${UV[@]}" export --frozen --package "$package" --no-dev --format cyclonedx1.5 -o "$out" >/dev/null
  "${UV[@]}" export --frozen --package "$package" --no-dev --no-emit-project --no-hashes \
      --format requirements.txt -o "$OUT/$service.requirements.txt" >/dev/null
  python3 - "$out" "$OUT/$service.requirements.txt" "$package" <<'PY'
import json, re, sys
sbom, reqs, package = sys.argv[1:]
doc = json.load(open(sbom))
assert doc.get("bomFormat") == "CycloneDX", f"{sbom}: not a CycloneDX document"
assert doc["metadata"]["component"]["name"] == package, f"{sbom}: names no {package}"
have = {(c["name"], c.get("version")) for c in doc.get("components", [])}
want = set()
for line in open(reqs):
    m = re.match(r"^([A-Za-z0-9_.\-]+)==([^ ;]+)", line.strip())
    if m:
        want.add((m.group(1).lower().replace("_", "-"), m.group(2)))
missing = {w for w in want if (w[0], w[1]) not in {(n.lower().replace("_", "-"), v) for n, v in have}}
assert not missing, f"{sbom}: missing {sorted(missing)[:5]}"
print(f"{package}: {len(doc['components'])} components")
PY
done
