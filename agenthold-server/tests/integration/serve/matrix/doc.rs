//! The OpenAPI document as the matrix reads it: every operation with its minimum role, path parameters,
//! kind of answer (JSON, SSE stream, WebSocket) and a request body built from its schema (the schema's own
//! example first, else the smallest valid value: required properties only, documented examples for
//! enum-like strings).

use serde_json::{Map, Value, json};

/// One operation of the document.
#[derive(Debug, Clone)]
pub(crate) struct Operation {
    /// `GET`, `POST`, …
    pub(crate) method: String,
    /// The path template (`/api/v1/workspaces/{ws}`).
    pub(crate) path: String,
    /// `x-agenthold-role`, if the operation has one.
    pub(crate) role: Option<String>,
    /// Path parameter names, in order.
    pub(crate) params: Vec<String>,
    /// Required query parameters with the document's example (or a placeholder) for each.
    pub(crate) query: Vec<(String, String)>,
    /// A request body, if the operation takes one.
    pub(crate) body: Option<Value>,
    /// Its success answers are only `text/event-stream`.
    pub(crate) stream: bool,
    /// It answers 101: a WebSocket.
    pub(crate) websocket: bool,
}

impl Operation {
    /// `METHOD path`.
    pub(crate) fn name(&self) -> String {
        format!("{} {}", self.method, self.path)
    }

    /// Whether the path names `{param}`.
    pub(crate) fn has(&self, param: &str) -> bool {
        self.params.iter().any(|p| p == param)
    }

    /// The path's last segment.
    pub(crate) fn last_segment(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or("")
    }

    /// The documented example (or placeholder) of a required query parameter.
    pub(crate) fn query_default(&self, name: &str) -> Option<String> {
        self.query.iter().find(|(q, _)| q == name).map(|(_, v)| v.clone())
    }

    /// The path with its parameters and the required query filled in by `value` (by name).
    pub(crate) fn url(&self, mut value: impl FnMut(&str) -> String) -> String {
        let mut url = String::new();
        for (i, segment) in self.path.split('/').enumerate() {
            if i > 0 {
                url.push('/');
            }
            match segment.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                Some(name) => url.push_str(&value(name)),
                None => url.push_str(segment),
            }
        }
        for (i, (k, _)) in self.query.iter().enumerate() {
            url.push(if i == 0 { '?' } else { '&' });
            url.push_str(&format!("{k}={}", value(k)));
        }
        url
    }
}

/// Every operation of the document, sorted by path and method.
pub(crate) fn operations(doc: &Value) -> Vec<Operation> {
    let mut out = Vec::new();
    let Some(paths) = doc["paths"].as_object() else {
        return out;
    };
    for (path, item) in paths {
        let Some(item) = item.as_object() else {
            continue;
        };
        for (method, op) in item {
            if !matches!(
                method.as_str(),
                "get" | "put" | "post" | "delete" | "patch" | "head" | "options" | "trace"
            ) {
                continue;
            }
            let parameters: Vec<Value> = item
                .get("parameters")
                .and_then(Value::as_array)
                .into_iter()
                .chain(op["parameters"].as_array())
                .flatten()
                .map(|p| resolve(doc, p).clone())
                .collect();
            let params = path
                .split('/')
                .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
                .map(str::to_owned)
                .collect();
            let query = parameters
                .iter()
                .filter(|p| p["in"] == "query" && p["required"] == true)
                .map(|p| {
                    let v = example(doc, &p["schema"], 0);
                    let v = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
                    (p["name"].as_str().unwrap_or_default().to_owned(), v)
                })
                .collect();
            let body = request_body(doc, op);
            let responses = op["responses"].as_object().cloned().unwrap_or_default();
            let success_types: Vec<String> = responses
                .iter()
                .filter(|(s, _)| s.starts_with('2'))
                .flat_map(|(_, r)| {
                    resolve(doc, r)["content"]
                        .as_object()
                        .map(|c| c.keys().cloned().collect::<Vec<_>>())
                        .unwrap_or_default()
                })
                .collect();
            out.push(Operation {
                method: method.to_ascii_uppercase(),
                path: path.clone(),
                role: op["x-agenthold-role"].as_str().map(str::to_owned),
                params,
                query,
                body,
                stream: !success_types.is_empty()
                    && success_types.iter().all(|t| t.starts_with("text/event-stream")),
                websocket: responses.contains_key("101"),
            });
        }
    }
    out.sort_by(|a, b| (&a.path, &a.method).cmp(&(&b.path, &b.method)));
    out
}

/// The request body of `op`: the media type's example, else one built from its schema.
fn request_body(doc: &Value, op: &Value) -> Option<Value> {
    let body = resolve(doc, &op["requestBody"]);
    let content = body["content"].as_object()?;
    let media = content
        .get("application/json")
        .or_else(|| content.values().next())?;
    if let Some(example) = media.get("example") {
        return Some(example.clone());
    }
    Some(example(doc, &media["schema"], 0))
}

/// Follow a `$ref` (`#/components/…`).
pub(crate) fn resolve<'a>(doc: &'a Value, value: &'a Value) -> &'a Value {
    let mut value = value;
    for _ in 0..16 {
        let Some(reference) = value["$ref"].as_str() else {
            return value;
        };
        let Some(pointer) = reference.strip_prefix('#') else {
            return value;
        };
        value = doc.pointer(pointer).unwrap_or(&Value::Null);
    }
    value
}

/// The smallest valid value of `schema`: its example, enum or const; required properties of objects; one
/// item in arrays; type-appropriate scalars.
pub(crate) fn example(doc: &Value, schema: &Value, depth: usize) -> Value {
    if depth > 12 {
        return Value::Null;
    }
    // A property's own example wins over the type it refers to.
    if let Some(e) = schema.get("example") {
        return e.clone();
    }
    if let Some(e) = schema["examples"].as_array().and_then(|e| e.first()) {
        return e.clone();
    }
    let schema = resolve(doc, schema);
    if let Some(e) = schema.get("example") {
        return e.clone();
    }
    if let Some(e) = schema["examples"].as_array().and_then(|e| e.first()) {
        return e.clone();
    }
    if let Some(c) = schema.get("const") {
        return c.clone();
    }
    if let Some(first) = schema["enum"]
        .as_array()
        .and_then(|e| e.iter().find(|v| !v.is_null()))
    {
        return first.clone();
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(variants) = schema[key].as_array() {
            let variant = variants
                .iter()
                .find(|v| resolve(doc, v)["type"] != "null")
                .unwrap_or(&Value::Null);
            return example(doc, variant, depth + 1);
        }
    }
    if let Some(parts) = schema["allOf"].as_array() {
        let mut merged = Map::new();
        for part in parts {
            if let Value::Object(o) = example(doc, part, depth + 1) {
                merged.extend(o);
            }
        }
        return Value::Object(merged);
    }
    let kind = match &schema["type"] {
        Value::String(t) => t.clone(),
        Value::Array(types) => types
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null")
            .unwrap_or("null")
            .to_owned(),
        _ if schema.get("properties").is_some() => "object".to_owned(),
        _ => "null".to_owned(),
    };
    match kind.as_str() {
        "object" => {
            let mut object = Map::new();
            for name in schema["required"].as_array().into_iter().flatten() {
                let Some(name) = name.as_str() else { continue };
                let property = &schema["properties"][name];
                object.insert(name.to_owned(), example(doc, property, depth + 1));
            }
            Value::Object(object)
        }
        "array" => {
            let min = schema["minItems"].as_u64().unwrap_or(1).max(1);
            let item = example(doc, &schema["items"], depth + 1);
            Value::Array((0..min).map(|_| item.clone()).collect())
        }
        "string" => {
            let min = usize::try_from(schema["minLength"].as_u64().unwrap_or(1)).unwrap_or(1);
            match schema["format"].as_str() {
                Some("date-time") => json!("2026-01-01T00:00:00Z"),
                Some("uri" | "url") => json!("http://example.com/"),
                Some("email") => json!("someone@example.com"),
                _ => Value::String("x".repeat(min.max(1))),
            }
        }
        "integer" => json!(schema["minimum"].as_i64().unwrap_or(1).max(1)),
        "number" => json!(schema["minimum"].as_f64().unwrap_or(1.0).max(1.0)),
        "boolean" => json!(false),
        _ => Value::Null,
    }
}
