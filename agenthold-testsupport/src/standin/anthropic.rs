//! The Anthropic Messages API stand-in: `POST /v1/messages` (streamed or not), `count_tokens`, and a
//! generic `200 {}` for the few other calls Claude Code makes at start.
//!
//! Script: a request whose last user turn carries a `tool_result` gets a final text message quoting it
//! ([`super::FINAL_TEXT`]); a request offering a `Bash` tool gets a `tool_use` of `Bash` running
//! [`super::TOOL_COMMAND`]; anything else (title generation, quota probes) gets a short text.

use serde_json::{Value, json};

use super::{FINAL_TEXT, Reply, Routes, TOOL_COMMAND, text_of};
use crate::EchoRequest;

/// Input and output tokens every answer reports.
pub const USAGE: (u64, u64) = (21, 9);

/// Add the Messages API routes to `routes`.
pub fn routes(routes: &mut Routes) {
    routes
        .route("POST", "/v1/messages/count_tokens", |_| {
            Reply::json(200, &json!({"input_tokens": USAGE.0}))
        })
        .route("POST", "/v1/messages", messages)
        // Claude Code's start-up probes (settings, feature flags, metrics): nothing it needs.
        .route("*", "/api/", |_| Reply::json(200, &json!({})));
}

/// What the script answers: a tool call, or a final text.
enum Turn {
    Tool,
    Final(String),
    Plain,
}

fn turn(body: &Value) -> Turn {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    if let Some(last) = messages.last()
        && last["role"] == "user"
        && let Some(blocks) = last["content"].as_array()
        && let Some(result) = blocks.iter().find(|b| b["type"] == "tool_result")
    {
        return Turn::Final(text_of(&result["content"]));
    }
    let offers_bash = body["tools"]
        .as_array()
        .is_some_and(|tools| tools.iter().any(|t| t["name"] == "Bash"));
    if offers_bash { Turn::Tool } else { Turn::Plain }
}

fn messages(request: &EchoRequest) -> Reply {
    let Ok(body) = serde_json::from_slice::<Value>(&request.body) else {
        return Reply::json(
            400,
            &json!({"type": "error", "error": {"type": "invalid_request_error", "message": "not JSON"}}),
        );
    };
    let model = body["model"].as_str().unwrap_or("claude-standin").to_owned();
    let (content, stop) = match turn(&body) {
        Turn::Tool => (
            json!({"type": "tool_use", "id": "toolu_standin_1", "name": "Bash",
                   "input": {"command": TOOL_COMMAND, "description": "Say hello from the tool"}}),
            "tool_use",
        ),
        Turn::Final(output) => (
            json!({"type": "text", "text": format!("{FINAL_TEXT}: {}", output.trim())}),
            "end_turn",
        ),
        Turn::Plain => (json!({"type": "text", "text": "ok"}), "end_turn"),
    };
    let id = format!("msg_standin_{}", request.body.len());
    if body["stream"] != json!(true) {
        return Reply::json(
            200,
            &json!({"id": id, "type": "message", "role": "assistant", "model": model,
                    "content": [content], "stop_reason": stop, "stop_sequence": null,
                    "usage": {"input_tokens": USAGE.0, "output_tokens": USAGE.1}}),
        );
    }
    let (start, delta) = if content["type"] == "tool_use" {
        (
            json!({"type": "tool_use", "id": content["id"], "name": content["name"], "input": {}}),
            json!({"type": "input_json_delta", "partial_json": content["input"].to_string()}),
        )
    } else {
        (
            json!({"type": "text", "text": ""}),
            json!({"type": "text_delta", "text": content["text"]}),
        )
    };
    Reply::sse(&[
        (
            "message_start",
            json!({"type": "message_start", "message": {"id": id, "type": "message", "role": "assistant",
                   "model": model, "content": [], "stop_reason": null, "stop_sequence": null,
                   "usage": {"input_tokens": USAGE.0, "output_tokens": 1,
                             "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": start}),
        ),
        ("ping", json!({"type": "ping"})),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": delta}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
                   "usage": {"output_tokens": USAGE.1}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_asks_for_the_tool_then_quotes_its_result() {
        let first = json!({"messages": [{"role": "user", "content": "hi"}], "tools": [{"name": "Bash"}]});
        assert!(matches!(turn(&first), Turn::Tool));
        let second = json!({"messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "Bash", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                          "content": [{"type": "text", "text": "hello-from-tool\n"}]}]}],
            "tools": [{"name": "Bash"}]});
        assert!(matches!(turn(&second), Turn::Final(t) if t == "hello-from-tool\n"));
        assert!(matches!(turn(&json!({"messages": []})), Turn::Plain));
    }
}
