//! Manifests as `kubectl apply` takes them: YAML with several documents, or JSON (one object,
//! several, or an array), `List` objects (`kind: List` and the `...List` kinds `kubectl get -o
//! yaml` writes) flattened into their items. Each object keeps where it came from.

use serde::Deserialize;
use serde_json::Value;

use super::{Finding, Place, Severity};

/// One object and where it was read.
#[derive(Clone, Debug, PartialEq)]
pub struct Document {
    pub place: Place,
    pub value: Value,
}

/// Reads every object of one file's text. `file` names it in places (`-` for standard input).
/// A text that is neither YAML nor JSON is one finding naming the document and where in it.
pub fn read_documents(file: &str, text: &str) -> Result<Vec<Document>, Box<Finding>> {
    let mut documents = Vec::new();
    let looks_like_json = text.trim_start().starts_with(['{', '[']);
    if looks_like_json {
        let stream = serde_json::Deserializer::from_str(text).into_iter::<Value>();
        for (index, value) in stream.enumerate() {
            let place = Place::file(file, index + 1);
            match value {
                Ok(value) => push_objects(&mut documents, place, value)?,
                Err(err) => return Err(invalid(place, format!("is not JSON: {err}"))),
            }
        }
        return Ok(documents);
    }
    for (index, document) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let place = Place::file(file, index + 1);
        match Value::deserialize(document) {
            Ok(value) => push_objects(&mut documents, place, value)?,
            Err(err) => return Err(invalid(place, format!("is not YAML: {err}"))),
        }
    }
    Ok(documents)
}

fn invalid(place: Place, message: String) -> Box<Finding> {
    Box::new(Finding { severity: Severity::Invalid, place, object: None, field: String::new(), message })
}

/// Adds an object, the items of a list, or nothing for an empty document (`---` at the end of a
/// file, or a file of comments).
fn push_objects(documents: &mut Vec<Document>, place: Place, value: Value) -> Result<(), Box<Finding>> {
    match value {
        Value::Null => Ok(()),
        Value::Array(items) => {
            for (i, item) in items.into_iter().enumerate() {
                push_item(documents, place.item(i), item)?;
            }
            Ok(())
        }
        Value::Object(_) => {
            let kind = value.get("kind").and_then(Value::as_str).unwrap_or_default();
            let is_list = kind == "List" || (kind.ends_with("List") && value.get("items").is_some_and(Value::is_array));
            if !is_list {
                documents.push(Document { place, value });
                return Ok(());
            }
            let Some(Value::Array(items)) = value.get("items").cloned() else {
                return Err(Box::new(Finding {
                    severity: Severity::Invalid,
                    place,
                    object: Some(kind.to_string()),
                    field: "items".into(),
                    message: "must be a list of objects".into(),
                }));
            };
            for (i, item) in items.into_iter().enumerate() {
                push_item(documents, place.item(i), item)?;
            }
            Ok(())
        }
        other => Err(invalid(
            place,
            format!(
                "is {}, not a Kubernetes object (a map with apiVersion, kind and metadata)",
                super::node::kind(&other)
            ),
        )),
    }
}

fn push_item(documents: &mut Vec<Document>, place: Place, item: Value) -> Result<(), Box<Finding>> {
    if !item.is_object() {
        return Err(invalid(
            place,
            format!(
                "is {}, not a Kubernetes object (a map with apiVersion, kind and metadata)",
                super::node::kind(&item)
            ),
        ));
    }
    documents.push(Document { place, value: item });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_documents_lists_and_json_are_read_with_their_places() {
        let yaml = "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: a/v1, kind: A}\n- {apiVersion: a/v1, kind: B}\n---\n---\napiVersion: a/v1\nkind: C\n";
        let docs = read_documents("f.yaml", yaml).unwrap();
        let places: Vec<String> = docs.iter().map(|d| d.place.to_string()).collect();
        assert_eq!(places, ["f.yaml#1 items[0]", "f.yaml#1 items[1]", "f.yaml#3"]);
        let json = r#"{"apiVersion":"a/v1","kind":"A"} {"apiVersion":"a/v1","kind":"B"}"#;
        assert_eq!(read_documents("f.json", json).unwrap().len(), 2);
    }

    #[test]
    fn text_that_is_not_yaml_names_its_document() {
        let err = read_documents("bad.yaml", "kind: A\n---\nkind: [unclosed\n").unwrap_err();
        assert_eq!(err.place.to_string(), "bad.yaml#2");
        assert!(err.message.starts_with("is not YAML"), "{}", err.message);
        let err = read_documents("bad.yaml", "just words\n").unwrap_err();
        assert!(err.message.contains("not a Kubernetes object"), "{}", err.message);
    }
}
