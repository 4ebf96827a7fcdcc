//! The OpenAI Responses API stand-in in the shape the Codex CLI reads: `POST /v1/responses` streamed as
//! server-sent events (`response.created`, output items, `response.completed` with usage), plus an empty
//! model list.
//!
//! Script: a request whose input carries a `function_call_output` (or `custom_tool_call_output`) gets a
//! final assistant message quoting it ([`super::FINAL_TEXT`]); otherwise a call running the given command
//! (by default [`super::TOOL_COMMAND`]): through code mode's `exec` tool (JavaScript calling
//! `tools.exec_command`) when the request offers it, else the shell tool the request offers (`shell`,
//! `shell_command` or `exec_command`).

use serde_json::{Value, json};

use super::{FINAL_TEXT, Reply, Routes, text_of};
use crate::EchoRequest;

/// Input and output tokens every answer reports.
pub const USAGE: (u64, u64) = (34, 12);

/// Add the Responses API routes to `routes`; the scripted tool call runs `command`. Served twice: at
/// `api.openai.com`'s `/v1/` (an API key) and at `chatgpt.com`'s `/backend-api/codex/` (a ChatGPT
/// account, Codex's built-in provider).
pub fn routes(routes: &mut Routes, command: &str) {
    for prefix in ["/v1", "/backend-api/codex"] {
        let command = command.to_owned();
        routes
            .route("POST", &format!("{prefix}/responses"), move |r| {
                responses(r, &command)
            })
            .route("GET", &format!("{prefix}/models"), |_| {
                Reply::json(200, &json!({"object": "list", "data": [], "models": []}))
            });
    }
}

/// Whether the request offers Codex's "code mode": a freeform `exec` tool (JavaScript that calls the
/// other tools), listed in an `additional_tools` input item (the default model of codex 0.171).
fn offers_code_mode(body: &Value) -> bool {
    let Some(input) = body["input"].as_array() else {
        return false;
    };
    input
        .iter()
        .filter(|i| i["type"] == "additional_tools")
        .flat_map(|i| i["tools"].as_array().cloned().unwrap_or_default())
        .flat_map(|ns| ns["tools"].as_array().cloned().unwrap_or_default())
        .any(|t| t["type"] == "custom" && t["name"] == "exec")
}

/// The code-mode call running `command`: JavaScript calling `exec_command`, its result as text.
fn code_mode_call(command: &str) -> Value {
    let source = format!(
        "const r = await tools.exec_command({{cmd: {}}});\ntext(r);\n",
        Value::String(command.to_owned())
    );
    json!({"type": "custom_tool_call", "id": "ctc_standin_1", "call_id": "call_standin_1",
           "status": "completed", "name": "exec", "input": source})
}

/// The shell function call for the tools a request offers: `(name, arguments JSON)`.
fn shell_call(body: &Value, command: &str) -> (String, String) {
    let names: Vec<&str> = body["tools"]
        .as_array()
        .map(|tools| tools.iter().filter_map(|t| t["name"].as_str()).collect())
        .unwrap_or_default();
    let args = if names.contains(&"shell") {
        ("shell", json!({"command": ["bash", "-lc", command]}))
    } else if names.contains(&"exec_command") {
        ("exec_command", json!({"cmd": command}))
    } else {
        ("shell_command", json!({"command": command}))
    };
    (args.0.to_owned(), args.1.to_string())
}

/// The output of the last function call in the input, if the input carries one.
fn tool_output(body: &Value) -> Option<String> {
    body["input"].as_array()?.iter().rev().find_map(|item| {
        let kind = item["type"].as_str()?;
        kind.ends_with("call_output").then(|| match &item["output"] {
            Value::Object(o) => o.get("content").map_or_else(String::new, text_of),
            other => text_of(other),
        })
    })
}

fn responses(request: &EchoRequest, command: &str) -> Reply {
    let Ok(body) = serde_json::from_slice::<Value>(&request.body) else {
        return Reply::json(
            400,
            &json!({"error": {"message": "not JSON", "type": "invalid_request_error"}}),
        );
    };
    let model = body["model"].as_str().unwrap_or("gpt-standin").to_owned();
    let id = format!("resp_standin_{}", request.body.len());
    let item = match tool_output(&body) {
        Some(output) => {
            let text = format!("{FINAL_TEXT}: {}", final_output(&output));
            json!({"type": "message", "id": "msg_standin_1", "role": "assistant", "status": "completed",
                   "content": [{"type": "output_text", "text": text, "annotations": []}]})
        }
        None if offers_code_mode(&body) => code_mode_call(command),
        None => {
            let (name, arguments) = shell_call(&body, command);
            json!({"type": "function_call", "id": "fc_standin_1", "call_id": "call_standin_1",
                   "status": "completed", "name": name, "arguments": arguments})
        }
    };
    let response = |status: &str, output: Value| {
        json!({"id": id, "object": "response", "created_at": 1_700_000_000, "status": status,
               "model": model, "output": output})
    };
    let mut events = vec![
        (
            "response.created",
            json!({"type": "response.created", "response": response("in_progress", json!([]))}),
        ),
        (
            "response.output_item.added",
            json!({"type": "response.output_item.added", "output_index": 0, "item": item}),
        ),
    ];
    if let Some(text) = item["content"][0]["text"].as_str() {
        events.push((
            "response.output_text.delta",
            json!({"type": "response.output_text.delta", "item_id": "msg_standin_1", "output_index": 0,
                   "content_index": 0, "delta": text}),
        ));
    }
    let mut completed = response("completed", json!([item]));
    completed["usage"] = json!({"input_tokens": USAGE.0, "input_tokens_details": {"cached_tokens": 0},
                                "output_tokens": USAGE.1, "output_tokens_details": {"reasoning_tokens": 0},
                                "total_tokens": USAGE.0 + USAGE.1});
    events.push((
        "response.output_item.done",
        json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
    ));
    events.push((
        "response.completed",
        json!({"type": "response.completed", "response": completed}),
    ));
    Reply::sse(&events)
}

/// A shell tool's output as Codex reports it: plain text, or JSON / a transcript with an `Output:` part.
fn final_output(raw: &str) -> String {
    if let Ok(v) = serde_json::from_str::<Value>(raw)
        && let Some(out) = v["output"].as_str()
    {
        return out.trim().to_owned();
    }
    // Code mode: a status line, then what the script gave `text()` (the `exec_command` result as JSON).
    if let Some(start) = raw.find('{')
        && let Ok(v) = serde_json::from_str::<Value>(&raw[start..])
        && let Some(out) = v["output"].as_str()
    {
        return out.trim().to_owned();
    }
    raw.rsplit("Output:\n").next().unwrap_or(raw).trim().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::standin::TOOL_COMMAND;

    #[test]
    fn the_script_calls_the_offered_shell_tool_then_quotes_its_output() {
        let body = json!({"input": [{"type": "message", "role": "user", "content": []}],
                          "tools": [{"type": "function", "name": "exec_command"}]});
        assert_eq!(tool_output(&body), None);
        assert_eq!(shell_call(&body, TOOL_COMMAND).0, "exec_command");
        let body = json!({"tools": [{"type": "function", "name": "shell"}]});
        let (name, args) = shell_call(&body, TOOL_COMMAND);
        assert_eq!(name, "shell");
        assert!(args.contains("echo hello-from-tool"), "{args}");
        let body = json!({"input": [{"type": "function_call_output", "call_id": "c",
                                     "output": "{\"output\":\"hello-from-tool\\n\",\"metadata\":{}}"}]});
        assert_eq!(final_output(&tool_output(&body).unwrap()), "hello-from-tool");
        assert_eq!(
            final_output("Exit code: 0\nOutput:\nhello-from-tool\n"),
            "hello-from-tool"
        );
    }

    #[test]
    fn code_mode_gets_javascript_calling_exec_command() {
        let body = json!({"input": [{"type": "additional_tools", "tools": [
            {"type": "namespace", "name": "functions", "tools": [{"type": "custom", "name": "exec"}]}]}]});
        assert!(offers_code_mode(&body));
        assert!(!offers_code_mode(&json!({"tools": [{"name": "exec"}]})));
        let call = code_mode_call("echo \"x\"");
        assert_eq!(call["type"], "custom_tool_call");
        assert_eq!(
            call["input"],
            "const r = await tools.exec_command({cmd: \"echo \\\"x\\\"\"});\ntext(r);\n"
        );
        let output = json!({"input": [{"type": "custom_tool_call_output", "call_id": "c", "output": [
            {"type": "input_text", "text": "Script completed\nOutput:\n"},
            {"type": "input_text", "text": "{\"exit_code\":0,\"output\":\"hello-from-tool\\n\"}"}]}]});
        assert_eq!(final_output(&tool_output(&output).unwrap()), "hello-from-tool");
    }
}
