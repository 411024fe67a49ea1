//! Our `proto/modal_api.proto` against the descriptor embedded in Modal's
//! official Python client (`modal_proto.api_pb2.DESCRIPTOR`, from the
//! `modal` wheel on PyPI): every message, field (name, number, type, label,
//! oneof), enum value and RPC we declare must be there, the same. An
//! upstream protocol change fails this test, not our users. A second test
//! holds the declarations the context mount and blob uploads need (the
//! image's `context_mount_id`, `BlobCreateResponse`'s multipart forms) to
//! Modal's field numbers and oneofs, without Python.
//!
//! Needs `python3` with `modal` installed (`.ci/run` installs it). Under
//! CI a missing `modal` fails the test; elsewhere it is skipped with the
//! reason printed (`orch_test_support::skip`).

use prost::Message;
use prost_types::{DescriptorProto, EnumDescriptorProto, FileDescriptorProto, FileDescriptorSet};
use std::collections::BTreeMap;

fn official() -> Option<FileDescriptorProto> {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import base64, modal_proto.api_pb2 as a; print(base64.b64encode(a.DESCRIPTOR.serialized_pb).decode())",
        ])
        .output();
    let ok = matches!(&out, Ok(o) if o.status.success());
    if !ok {
        let why = match out {
            Ok(o) => String::from_utf8_lossy(&o.stderr).to_string(),
            Err(e) => e.to_string(),
        };
        orch_test_support::skip::skip_or_fail(
            &orch_test_support::skip::current_test(),
            &format!(
                "python3 with the official `modal` client is not installed here (pip install modal): {why}"
            ),
        );
        return None;
    }
    let text = String::from_utf8(out.unwrap().stdout).unwrap();
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .unwrap();
    Some(FileDescriptorProto::decode(bytes.as_slice()).unwrap())
}

fn ours() -> FileDescriptorProto {
    let set = FileDescriptorSet::decode(orch_modal_proto::DESCRIPTOR).unwrap();
    set.file
        .into_iter()
        .find(|f| f.package() == "modal.client")
        .expect("our file declares package modal.client")
}

fn messages(prefix: &str, list: &[DescriptorProto], out: &mut BTreeMap<String, DescriptorProto>) {
    for m in list {
        let name = format!("{prefix}.{}", m.name());
        messages(&name, &m.nested_type, out);
        out.insert(name, m.clone());
    }
}

fn enums(
    prefix: &str,
    msgs: &[DescriptorProto],
    list: &[EnumDescriptorProto],
    out: &mut BTreeMap<String, EnumDescriptorProto>,
) {
    for e in list {
        out.insert(format!("{prefix}.{}", e.name()), e.clone());
    }
    for m in msgs {
        let name = format!("{prefix}.{}", m.name());
        enums(&name, &m.nested_type, &m.enum_type, out);
    }
}

#[test]
fn every_declaration_matches_modals_own() {
    let Some(theirs) = official() else { return };
    let ours = ours();
    assert_eq!(ours.package(), theirs.package());
    let mut problems = Vec::new();

    let (mut om, mut tm) = (BTreeMap::new(), BTreeMap::new());
    messages(".modal.client", &ours.message_type, &mut om);
    messages(".modal.client", &theirs.message_type, &mut tm);
    for (name, m) in &om {
        let Some(t) = tm.get(name) else {
            problems.push(format!("message {name} is not in Modal's API"));
            continue;
        };
        for f in &m.field {
            let Some(tf) = t.field.iter().find(|tf| tf.name() == f.name()) else {
                problems.push(format!("{name}.{} is not in Modal's API", f.name()));
                continue;
            };
            if tf.number() != f.number() {
                problems.push(format!(
                    "{name}.{}: number {} here, {} in Modal's",
                    f.name(),
                    f.number(),
                    tf.number()
                ));
            }
            if tf.r#type() != f.r#type() || tf.type_name() != f.type_name() {
                problems.push(format!(
                    "{name}.{}: type {:?} {} here, {:?} {} in Modal's",
                    f.name(),
                    f.r#type(),
                    f.type_name(),
                    tf.r#type(),
                    tf.type_name()
                ));
            }
            if tf.label() != f.label() {
                problems.push(format!(
                    "{name}.{}: label {:?} here, {:?} in Modal's",
                    f.name(),
                    f.label(),
                    tf.label()
                ));
            }
            // A field in a oneof here is in the oneof of the same name there.
            let oneof = |d: &DescriptorProto, i: Option<i32>| {
                i.and_then(|i| d.oneof_decl.get(i as usize))
                    .map(|o| o.name().to_string())
            };
            let (a, b) = (
                oneof(m, f.oneof_index).filter(|_| !f.proto3_optional()),
                oneof(t, tf.oneof_index).filter(|_| !tf.proto3_optional()),
            );
            if a.is_some() && a != b {
                problems.push(format!("{name}.{}: oneof {a:?} here, {b:?} in Modal's", f.name()));
            }
        }
        if m.options.as_ref().and_then(|o| o.map_entry) != t.options.as_ref().and_then(|o| o.map_entry) {
            problems.push(format!("{name}: map entry here and not there (or the reverse)"));
        }
    }

    let (mut oe, mut te) = (BTreeMap::new(), BTreeMap::new());
    enums(".modal.client", &ours.message_type, &ours.enum_type, &mut oe);
    enums(".modal.client", &theirs.message_type, &theirs.enum_type, &mut te);
    for (name, e) in &oe {
        let Some(t) = te.get(name) else {
            problems.push(format!("enum {name} is not in Modal's API"));
            continue;
        };
        for v in &e.value {
            match t.value.iter().find(|tv| tv.name() == v.name()) {
                Some(tv) if tv.number() == v.number() => {}
                Some(tv) => problems.push(format!(
                    "{name}.{}: {} here, {} in Modal's",
                    v.name(),
                    v.number(),
                    tv.number()
                )),
                None => problems.push(format!("{name}.{} is not in Modal's API", v.name())),
            }
        }
    }

    assert_eq!(ours.service.len(), 1);
    let svc = &ours.service[0];
    let Some(tsvc) = theirs.service.iter().find(|s| s.name() == svc.name()) else {
        panic!("service {} is not in Modal's API", svc.name());
    };
    for m in &svc.method {
        match tsvc.method.iter().find(|t| t.name() == m.name()) {
            None => problems.push(format!("rpc {} is not in Modal's API", m.name())),
            Some(t) => {
                if (
                    t.input_type(),
                    t.output_type(),
                    t.server_streaming(),
                    t.client_streaming(),
                ) != (
                    m.input_type(),
                    m.output_type(),
                    m.server_streaming(),
                    m.client_streaming(),
                ) {
                    problems.push(format!(
                        "rpc {}: ({}) -> {}{} here, ({}) -> {}{} in Modal's",
                        m.name(),
                        m.input_type(),
                        if m.server_streaming() { "stream " } else { "" },
                        m.output_type(),
                        t.input_type(),
                        if t.server_streaming() { "stream " } else { "" },
                        t.output_type()
                    ));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "our .proto differs from Modal's:\n{}",
        problems.join("\n")
    );
    eprintln!(
        "checked {} messages, {} enums and {} RPCs against Modal's descriptor",
        om.len(),
        oe.len(),
        svc.method.len()
    );
}

/// The fields a Dockerfile context and a large file travel by (issue 29): declared here
/// with Modal's numbers, so the check above holds them to Modal's descriptor.
#[test]
fn the_context_mount_and_blob_upload_fields_are_declared() {
    let ours = ours();
    let mut om = BTreeMap::new();
    messages(".modal.client", &ours.message_type, &mut om);
    let want = [
        ("Image", "context_mount_id", 15, None),
        ("BlobCreateResponse", "blob_id", 2, None),
        ("BlobCreateResponse", "upload_url", 1, Some("upload_type_oneof")),
        ("BlobCreateResponse", "multipart", 3, Some("upload_type_oneof")),
        ("BlobCreateResponse", "blob_ids", 4, None),
        ("BlobCreateResponse", "upload_urls", 5, Some("upload_types_oneof")),
        ("BlobCreateResponse", "multiparts", 6, Some("upload_types_oneof")),
        ("MultiPartUpload", "part_length", 1, None),
        ("MultiPartUpload", "upload_urls", 2, None),
        ("MultiPartUpload", "completion_url", 3, None),
        ("MultiPartUploadList", "items", 1, None),
        ("UploadUrlList", "items", 1, None),
        ("MountPutFileRequest", "data_blob_id", 5, Some("data_oneof")),
    ];
    for (msg, field, number, oneof) in want {
        let m = om
            .get(&format!(".modal.client.{msg}"))
            .unwrap_or_else(|| panic!("message {msg} is not declared"));
        let f = m
            .field
            .iter()
            .find(|f| f.name() == field)
            .unwrap_or_else(|| panic!("{msg}.{field} is not declared"));
        assert_eq!(f.number(), number, "{msg}.{field}");
        let got = f
            .oneof_index
            .and_then(|i| m.oneof_decl.get(i as usize))
            .map(|o| o.name().to_string());
        assert_eq!(got.as_deref(), oneof, "{msg}.{field}");
    }
}
