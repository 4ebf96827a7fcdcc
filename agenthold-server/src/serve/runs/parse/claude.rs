//! Claude Code's `--output-format stream-json --verbose` lines: one JSON object per line with a `type` of
//! `system` (`subtype: init` carries `session_id` and `model`), `assistant` and `user` (a `message` whose
//! `content` blocks are `text`, `thinking`, `tool_use` or `tool_result`), and a final `result` (`result`,
//! `is_error`, `session_id`, `usage`, `total_cost_usd`). Fields are read defensively: a missing or
//! mistyped one drops that piece, never the line, and a line that is not such an object is `None` (the
//! caller turns it into `raw`).
// enforces: P1

use serde_json::Value;

use super::super::events::EventKind;

/// The state of one run's Claude parser (none needed yet: every line stands on its own).
#[derive(Debug, Default)]
pub(crate) struct Claude;

fn str_of(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_owned)
}

fn u64_of(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

/// A tool result's `content`: a string, or blocks whose `text`s are joined.
fn content_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|b| match b {
                Value::String(s) => Some(s.clone()),
                b => str_of(b, "text"),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// The events of a message's content blocks.
fn blocks(role: &str, content: &Value, out: &mut Vec<EventKind>) {
    let blocks = match content {
        Value::String(text) => {
            out.push(EventKind::Message {
                role: role.to_owned(),
                text: text.clone(),
            });
            return;
        }
        Value::Array(blocks) => blocks,
        _ => return,
    };
    for block in blocks {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => {
                if let Some(text) = str_of(block, "text") {
                    out.push(EventKind::Message {
                        role: role.to_owned(),
                        text,
                    });
                }
            }
            Some("thinking") => {
                if let Some(text) = str_of(block, "thinking") {
                    out.push(EventKind::Message {
                        role: "reasoning".to_owned(),
                        text,
                    });
                }
            }
            Some("tool_use" | "server_tool_use") => out.push(EventKind::ToolCall {
                id: str_of(block, "id"),
                name: str_of(block, "name").unwrap_or_default(),
                input: block.get("input").cloned().unwrap_or(Value::Null),
            }),
            Some("tool_result") => out.push(EventKind::ToolResult {
                id: str_of(block, "tool_use_id"),
                output: content_text(block.get("content").unwrap_or(&Value::Null)),
                is_error: block.get("is_error").and_then(Value::as_bool).unwrap_or(false),
            }),
            _ => {}
        }
    }
}

impl Claude {
    /// The events of `line`, or `None` when it is not a Claude line.
    pub(crate) fn line(&mut self, line: &str) -> Option<Vec<EventKind>> {
        let v: Value = serde_json::from_str(line.trim()).ok()?;
        let kind = v.get("type")?.as_str()?;
        let mut out = Vec::new();
        match kind {
            "system" => {
                let session_id = str_of(&v, "session_id")?;
                if v.get("subtype").and_then(Value::as_str) != Some("init") {
                    return None;
                }
                out.push(EventKind::Session {
                    session_id,
                    model: str_of(&v, "model"),
                });
            }
            "assistant" | "user" => {
                let message = v.get("message")?;
                let role = str_of(message, "role").unwrap_or_else(|| kind.to_owned());
                blocks(&role, message.get("content")?, &mut out);
            }
            "result" => {
                if let Some(usage) = v.get("usage").filter(|u| u.is_object()) {
                    // Claude counts cached input separately; the run's input is all of it.
                    let input = u64_of(usage, "input_tokens")
                        .saturating_add(u64_of(usage, "cache_creation_input_tokens"))
                        .saturating_add(u64_of(usage, "cache_read_input_tokens"));
                    out.push(EventKind::Usage {
                        input_tokens: input,
                        output_tokens: u64_of(usage, "output_tokens"),
                        cost_usd: v
                            .get("total_cost_usd")
                            .and_then(Value::as_f64)
                            .filter(|c| c.is_finite()),
                    });
                }
                out.push(EventKind::Result {
                    text: str_of(&v, "result"),
                    is_error: v.get("is_error").and_then(Value::as_bool).unwrap_or(false)
                        || v.get("subtype")
                            .and_then(Value::as_str)
                            .is_some_and(|s| s.starts_with("error")),
                    session_id: str_of(&v, "session_id"),
                });
            }
            _ => return None,
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Option<Vec<EventKind>> {
        Claude.line(line)
    }

    // covers: P1
    #[test]
    fn real_shaped_lines_become_normalised_events() {
        let init = r#"{"type":"system","subtype":"init","cwd":"/workspace","session_id":"5f0e4c1e-1d2b-4a53-9f43-0e6a2b7c9d10","tools":["Bash","Read"],"mcp_servers":[],"model":"claude-sonnet-4-5-20250929","permissionMode":"bypassPermissions","apiKeySource":"ANTHROPIC_API_KEY"}"#;
        assert_eq!(
            parse(init).unwrap(),
            [EventKind::Session {
                session_id: "5f0e4c1e-1d2b-4a53-9f43-0e6a2b7c9d10".into(),
                model: Some("claude-sonnet-4-5-20250929".into())
            }]
        );
        let assistant = r#"{"type":"assistant","message":{"id":"msg_01","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"thinking","thinking":"hmm","signature":"x"},{"type":"text","text":"Let me look."},{"type":"tool_use","id":"toolu_01A","name":"Bash","input":{"command":"ls -la","description":"List"}}],"stop_reason":"tool_use","usage":{"input_tokens":10,"output_tokens":5}},"parent_tool_use_id":null,"session_id":"s"}"#;
        let events = parse(assistant).unwrap();
        assert_eq!(events.len(), 3);
        assert_eq!(
            events[1],
            EventKind::Message {
                role: "assistant".into(),
                text: "Let me look.".into()
            }
        );
        assert_eq!(
            events[2],
            EventKind::ToolCall {
                id: Some("toolu_01A".into()),
                name: "Bash".into(),
                input: serde_json::json!({"command": "ls -la", "description": "List"})
            }
        );
        let user = r#"{"type":"user","message":{"role":"user","content":[{"tool_use_id":"toolu_01A","type":"tool_result","content":[{"type":"text","text":"a\nb"}],"is_error":false}]},"parent_tool_use_id":null,"session_id":"s"}"#;
        assert_eq!(
            parse(user).unwrap(),
            [EventKind::ToolResult {
                id: Some("toolu_01A".into()),
                output: "a\nb".into(),
                is_error: false
            }]
        );
        let failed = r#"{"type":"user","message":{"role":"user","content":[{"tool_use_id":"t2","type":"tool_result","content":"command not found","is_error":true}]}}"#;
        assert!(
            matches!(&parse(failed).unwrap()[0], EventKind::ToolResult { is_error: true, output, .. } if output == "command not found")
        );
        let result = r#"{"type":"result","subtype":"success","is_error":false,"duration_ms":2345,"duration_api_ms":2000,"num_turns":2,"result":"Done: 2 files.","session_id":"5f0e","total_cost_usd":0.0123,"usage":{"input_tokens":12,"cache_creation_input_tokens":100,"cache_read_input_tokens":1000,"output_tokens":50,"server_tool_use":{"web_search_requests":0},"service_tier":"standard"},"permission_denials":[],"uuid":"u"}"#;
        assert_eq!(
            parse(result).unwrap(),
            [
                EventKind::Usage {
                    input_tokens: 1112,
                    output_tokens: 50,
                    cost_usd: Some(0.0123)
                },
                EventKind::Result {
                    text: Some("Done: 2 files.".into()),
                    is_error: false,
                    session_id: Some("5f0e".into())
                }
            ]
        );
        let error = r#"{"type":"result","subtype":"error_max_turns","is_error":false,"session_id":"s"}"#;
        assert!(matches!(
            &parse(error).unwrap()[0],
            EventKind::Result {
                is_error: true,
                text: None,
                ..
            }
        ));
    }

    // covers: P1
    #[test]
    fn garbage_is_not_a_claude_line_and_never_panics() {
        for line in [
            "",
            "not json",
            "{",
            "[]",
            "null",
            "42",
            r#"{"type":7}"#,
            r#"{"type":"assistant"}"#,
            r#"{"type":"assistant","message":"x"}"#,
            r#"{"type":"system","subtype":"init"}"#,
            r#"{"type":"system","subtype":"compact_boundary","session_id":"s"}"#,
            r#"{"type":"stream_event","event":{}}"#,
            r#"{"type":"item.completed","item":{}}"#,
            "\u{0}\u{fffd}\u{202e}",
            &"[".repeat(10_000),
        ] {
            assert_eq!(parse(line), None, "{line:.40}");
        }
        // Mistyped pieces are dropped, the rest of the line stays.
        let odd = r#"{"type":"assistant","message":{"content":[{"type":"text","text":5},{"type":"tool_use","name":null,"input":"x"},{"type":"image"},7,"s"]}}"#;
        let events = parse(odd).unwrap();
        assert_eq!(events.len(), 1);
        assert!(matches!(&events[0], EventKind::ToolCall { name, id: None, .. } if name.is_empty()));
        let weird_usage =
            r#"{"type":"result","usage":{"input_tokens":-1,"output_tokens":1e300},"total_cost_usd":"free"}"#;
        assert!(parse(weird_usage).is_some());
    }
}
