"""Validate the Kubernetes manifests offline against the published schemas (kubernetes-validate)."""

from __future__ import annotations

import sys
from pathlib import Path

import kubernetes_validate
import yaml


def main(directory: str) -> int:
    failures = 0
    for path in sorted(Path(directory).glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if not document:
                continue
            try:
                kubernetes_validate.validate(document, "1.30", strict=True)
            except kubernetes_validate.ValidationError as exc:
                failures += 1
                print(f"{path}: {document['kind']}/{document['metadata']['name']}: {exc.message}", file=sys.stderr)
            else:
                print(f"{path}: {document['kind']}/{document['metadata']['name']} valid")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "deploy/k8s"))
