"""Parses Prometheus text (stdin) with prometheus_client's standard parser and prints its
families as one JSON list: [{"name", "type", "samples": [[name, labels, value], ...]}, ...].
Text the parser refuses makes it exit non-zero with the parser's error on stderr."""

import json
import sys

from prometheus_client.parser import text_string_to_metric_families


def main() -> int:
    families = [
        {"name": f.name, "type": f.type, "samples": [[s.name, s.labels, s.value] for s in f.samples]}
        for f in text_string_to_metric_families(sys.stdin.read())
    ]
    print(json.dumps(families))
    return 0


if __name__ == "__main__":
    sys.exit(main())
