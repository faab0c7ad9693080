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
    failures += _nginx_config_matches(directory)
    return 1 if failures else 0


def _nginx_config_matches(directory: str) -> int:
    """The nginx ConfigMap carries deploy/nginx/hyperplace.conf (which docker-compose mounts) word for word."""
    config = Path(directory).parent / "nginx" / "hyperplace.conf"
    for path in sorted(Path(directory).glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document and document["kind"] == "ConfigMap" and "hyperplace.conf" in document.get("data", {}):
                if document["data"]["hyperplace.conf"].strip() != config.read_text().strip():
                    print(f"{path}: ConfigMap/{document['metadata']['name']} differs from {config}", file=sys.stderr)
                    return 1
                print(f"{path}: ConfigMap/{document['metadata']['name']} is {config}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "deploy/k8s"))
