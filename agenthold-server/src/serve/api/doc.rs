//! The answers every operation can give whatever its handler says, added to the OpenAPI document once for
//! all routes (so a new route is described right without repeating them): error bodies are
//! `application/problem+json`; 401 and 429 for credentials and rate limits (S7, S13); 403 for a
//! state-changing call refused as cross-origin (S6); 404 for ids in the path; 400 and 413 for request
//! bodies and query strings, 415 and 422 for JSON bodies (the rejections of [`Body`](super::Body) and
//! [`Params`](super::Params)).
//! API fuzzing (`make api-fuzz`) checks the server against the document, these included.

use utoipa::openapi::path::{Operation, ParameterIn};
use utoipa::openapi::schema::{Object, Type};
use utoipa::openapi::{Content, Header, OpenApi, Ref, RefOr, Response};

use super::error::PROBLEM_JSON;

/// Complete every operation of `doc` with the shared answers.
pub(super) fn finish(doc: &mut OpenApi) {
    for item in doc.paths.paths.values_mut() {
        let operations = [
            (false, item.get.as_mut()),
            (false, item.head.as_mut()),
            (false, item.options.as_mut()),
            (true, item.put.as_mut()),
            (true, item.post.as_mut()),
            (true, item.delete.as_mut()),
            (true, item.patch.as_mut()),
            (true, item.trace.as_mut()),
        ];
        for (mutating, op) in operations {
            if let Some(op) = op {
                complete(op, mutating);
            }
        }
    }
}

/// A response with a problem+json body.
fn problem(description: &str) -> Response {
    let mut response = Response::new(description);
    response.content.insert(
        PROBLEM_JSON.to_owned(),
        RefOr::T(Content::new(Some(Ref::from_schema_name("Problem")))),
    );
    response
}

fn complete(op: &mut Operation, mutating: bool) {
    // Error answers carry problem+json, whatever media type the annotation defaulted to.
    // A response object needs a description (OpenAPI 3.1); the annotations often leave it to the status.
    for (status, response) in &mut op.responses.responses {
        let RefOr::T(response) = response else {
            continue;
        };
        let code = status.parse::<u16>().unwrap_or(0);
        if code >= 400
            && let Some(content) = response.content.shift_remove("application/json")
        {
            response.content.insert(PROBLEM_JSON.to_owned(), content);
        }
        if response.description.is_empty() {
            response.description = http::StatusCode::from_u16(code)
                .ok()
                .and_then(|s| s.canonical_reason())
                .unwrap_or("answer")
                .to_owned();
        }
    }
    let public = op
        .extensions
        .as_ref()
        .and_then(|e| e.get(super::roles::ROLE_EXTENSION))
        .is_some_and(|role| role == "public");
    let params = op.parameters.as_deref().unwrap_or_default();
    let has = |place: ParameterIn| {
        params
            .iter()
            .any(|p| matches!(p, RefOr::T(p) if p.parameter_in == place))
    };
    let (path_ids, query) = (has(ParameterIn::Path), has(ParameterIn::Query));
    let body = op.request_body.is_some();
    // Only JSON bodies go through `Body` (415 for another media type, 422 for another shape).
    let json_body =
        matches!(&op.request_body, Some(RefOr::T(b)) if b.content.contains_key("application/json"));
    let mut shared: Vec<(&str, Response)> = Vec::new();
    if !public {
        shared.push(("401", problem("no valid personal token or session cookie")));
        let mut limited = problem("rate limited (per user, per token, per client address); see Retry-After");
        limited.headers.insert(
            "Retry-After".to_owned(),
            RefOr::T(Header::new(Object::with_type(Type::Integer))),
        );
        shared.push(("429", limited));
    }
    if mutating {
        shared.push((
            "403",
            problem("cross-origin request refused, or the role is too small"),
        ));
    }
    if path_ids {
        shared.push(("404", problem("no such resource, or hidden from the caller")));
    }
    if body || query {
        shared.push(("400", problem("malformed request")));
    }
    if body {
        shared.push(("413", problem("the body is over its size cap")));
    }
    if json_body {
        shared.push(("415", problem("the body is not sent as application/json")));
        shared.push(("422", problem("the body does not match the schema")));
    }
    for (status, response) in shared {
        op.responses
            .responses
            .entry(status.to_owned())
            .or_insert(RefOr::T(response));
    }
}

#[cfg(test)]
mod tests {
    /// The document's shape the role-matrix test and the fuzzer rely on, checked without a server: every
    /// operation has its role; path parameters are exactly the template's `{names}` (a query struct
    /// without `#[into_params(parameter_in = Query)]` is documented as a path parameter); error answers
    /// are problem+json; every answer has a description.
    #[test]
    fn every_operation_is_documented_the_way_the_checks_read_it() {
        let doc = serde_json::to_value(super::super::openapi()).unwrap();
        let mut problems = Vec::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            let names: Vec<&str> = path
                .split('/')
                .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
                .collect();
            for (method, op) in item.as_object().unwrap() {
                let name = format!("{} {path}", method.to_uppercase());
                if !op[crate::serve::api::roles::ROLE_EXTENSION].is_string() {
                    problems.push(format!("{name}: no x-agenthold-role"));
                }
                let params = op["parameters"].as_array().cloned().unwrap_or_default();
                let in_path: Vec<&str> = params
                    .iter()
                    .filter(|p| p["in"] == "path")
                    .filter_map(|p| p["name"].as_str())
                    .collect();
                for p in &in_path {
                    if !names.contains(p) {
                        problems.push(format!("{name}: {p} is documented in the path but is not in it"));
                    }
                }
                for n in &names {
                    if !in_path.contains(n) {
                        problems.push(format!("{name}: {{{n}}} is not documented"));
                    }
                }
                for (status, response) in op["responses"].as_object().unwrap() {
                    if response["description"].as_str().is_none_or(str::is_empty) {
                        problems.push(format!("{name}: {status} has no description"));
                    }
                    let error = status.parse::<u16>().is_ok_and(|s| s >= 400);
                    let types: Vec<&String> = response["content"]
                        .as_object()
                        .map(|c| c.keys().collect())
                        .unwrap_or_default();
                    if error && types.iter().any(|t| *t != super::PROBLEM_JSON) {
                        problems.push(format!("{name}: {status} is not problem+json: {types:?}"));
                    }
                }
            }
        }
        assert!(problems.is_empty(), "{problems:#?}");
    }
}
