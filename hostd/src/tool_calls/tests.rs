//! Tests of the tool-call parser: whole replies, every split point, malformed input.

use super::*;
use serde_json::json;

fn tools() -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "get_weather".into(),
            parameters: Some(json!({"type": "object", "properties": {
                "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"}
            }})),
        },
        ToolSpec {
            name: "search".into(),
            parameters: Some(json!({"type": "object", "properties": {
                "query": {"type": "string"}, "limit": {"type": "number"},
                "filters": {"type": "object"}, "paths": {"type": "array"}, "cursor": {"type": "null"}
            }})),
        },
        ToolSpec {
            name: "now".into(),
            parameters: None,
        },
    ]
}

/// Content, then two calls with string / integer / boolean / number / object / array / null
/// arguments, a multi-line string, and non-ASCII text.
const SAMPLE: &str = "Let me check — two lookups.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo\n</parameter>\n\
<parameter=days>\n3\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=search>\n\
<parameter=query>\nline one\n  line \"two\"\n</parameter>\n<parameter=limit>\n2.5\n</parameter>\n<parameter=filters>\n{\"lang\": \"rust\", \"n\": [1, 2]}\n</parameter>\n\
<parameter=paths>\n[\"src\", \"ü\"]\n</parameter>\n<parameter=cursor>\nnull\n</parameter>\n</function>\n</tool_call>";

fn expected_sample() -> (String, Vec<(String, String)>) {
    (
        "Let me check — two lookups.".to_string(),
        vec![
            ("get_weather".to_string(), r#"{"city":"São Paulo","days":3,"metric":true}"#.to_string()),
            (
                "search".to_string(),
                r#"{"query":"line one\n  line \"two\"","limit":2.5,"filters":{"lang":"rust","n":[1,2]},"paths":["src","ü"],"cursor":null}"#
                    .to_string(),
            ),
        ],
    )
}

fn feed_pieces(pieces: &[&str], max_calls: Option<usize>) -> (String, Vec<(String, String)>) {
    let mut p = ToolCallParser::new(tools(), max_calls);
    let mut events = Vec::new();
    for piece in pieces {
        events.extend(p.feed(piece));
    }
    events.extend(p.finish());
    fold(events)
}

#[test]
fn whole_sample_parses() {
    assert_eq!(parse_all(tools(), None, SAMPLE), expected_sample());
    let (_, calls) = expected_sample();
    for (_, args) in calls {
        serde_json::from_str::<Value>(&args).expect("arguments are JSON");
    }
}

#[test]
fn every_split_point_gives_the_same_result() {
    let want = expected_sample();
    for i in (0..=SAMPLE.len()).filter(|&i| SAMPLE.is_char_boundary(i)) {
        assert_eq!(
            feed_pieces(&[&SAMPLE[..i], &SAMPLE[i..]], None),
            want,
            "split at {i}"
        );
    }
}

#[test]
fn char_by_char_and_three_way_splits() {
    let want = expected_sample();
    let chars: Vec<String> = SAMPLE.chars().map(String::from).collect();
    let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(feed_pieces(&pieces, None), want);
    let b: Vec<usize> = (0..=SAMPLE.len())
        .filter(|&i| SAMPLE.is_char_boundary(i))
        .step_by(7)
        .collect();
    for (n, &i) in b.iter().enumerate() {
        for &j in &b[n..] {
            assert_eq!(
                feed_pieces(&[&SAMPLE[..i], &SAMPLE[i..j], &SAMPLE[j..]], None),
                want,
                "split at {i}, {j}"
            );
        }
    }
}

#[test]
fn streamed_events_start_calls_once_and_fragments_concatenate() {
    let mut p = ToolCallParser::new(tools(), None);
    let mut events = Vec::new();
    for c in SAMPLE.chars() {
        events.extend(p.feed(&c.to_string()));
    }
    events.extend(p.finish());
    let starts: Vec<_> = events
        .iter()
        .filter(|e| matches!(e, ToolEvent::CallStart { .. }))
        .collect();
    assert_eq!(starts.len(), 2);
    assert_eq!(p.reported_calls(), 2);
    // A call's first fragment comes right after its start and opens the object.
    let first = events
        .iter()
        .position(|e| matches!(e, ToolEvent::CallStart { index: 0, .. }))
        .expect("start");
    assert_eq!(
        events[first + 1],
        ToolEvent::Arguments {
            index: 0,
            fragment: "{".into()
        }
    );
    // Content never follows the first call here.
    let last_content = events
        .iter()
        .rposition(|e| matches!(e, ToolEvent::Content(_)))
        .expect("content");
    assert!(last_content < first);
}

#[test]
fn text_without_calls_is_untouched() {
    for text in [
        "plain answer",
        "  spaced\n\n",
        "a < b and <tool> but no call",
        "<tool_cal",
        "x <tool_call",
    ] {
        assert_eq!(
            parse_all(tools(), None, text),
            (text.to_string(), vec![]),
            "{text:?}"
        );
        for i in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
            assert_eq!(
                feed_pieces(&[&text[..i], &text[i..]], None),
                (text.to_string(), vec![]),
                "{text:?} at {i}"
            );
        }
    }
}

#[test]
fn unknown_functions_and_malformed_headers_stay_content() {
    let cases = [
        "<tool_call>\n<function=rm_rf>\n<parameter=path>\n/\n</parameter>\n</function>\n</tool_call>",
        "before <tool_call>\n{\"name\": \"get_weather\"}\n</tool_call>",
        "<tool_call>\n<function=get_weather",
        "<tool_call>\n",
        "<tool_call><function=get\nweather>",
    ];
    for text in cases {
        assert_eq!(
            parse_all(tools(), None, text),
            (text.to_string(), vec![]),
            "{text:?}"
        );
    }
    // A malformed block does not hide a real call after it.
    let text =
        "<tool_call>oops</tool_call> then <tool_call>\n<function=now>\n</function>\n</tool_call>";
    assert_eq!(
        parse_all(tools(), None, text),
        (
            "<tool_call>oops</tool_call> then".to_string(),
            vec![("now".to_string(), "{}".to_string())]
        )
    );
}

#[test]
fn lenient_inside_a_started_call() {
    // Missing </function>, stray text, missing </tool_call>, trailing text after the call.
    let text = "<tool_call>\n<function=get_weather>\nstray <parameter=city>\nOslo\n</parameter>\n</tool_call>\n\nDone.";
    assert_eq!(
        parse_all(tools(), None, text),
        (
            "Done.".to_string(),
            vec![("get_weather".to_string(), r#"{"city":"Oslo"}"#.to_string())]
        )
    );
    let text = "<tool_call>\n<function=now>\n</function>\nAfter.";
    assert_eq!(
        parse_all(tools(), None, text),
        (
            "After.".to_string(),
            vec![("now".to_string(), "{}".to_string())]
        )
    );
}

#[test]
fn a_reply_cut_inside_a_call_closes_it() {
    let text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nBer";
    assert_eq!(
        parse_all(tools(), None, text),
        (
            String::new(),
            vec![("get_weather".to_string(), r#"{"city":"Ber"}"#.to_string())]
        )
    );
    let text = "<tool_call>\n<function=get_weather>\n<parameter=ci";
    assert_eq!(
        parse_all(tools(), None, text),
        (
            String::new(),
            vec![("get_weather".to_string(), "{}".to_string())]
        )
    );
    // Issue 39 (d): half-written JSON is left out, not passed off as a string; a whole value
    // before it stays, and a string cut inside its closing tag keeps only its text.
    let text = "<tool_call>\n<function=search>\n<parameter=limit>\n5\n</parameter>\n<parameter=paths>\n[\"a\", \"b";
    assert_eq!(
        parse_all(tools(), None, text).1,
        vec![("search".to_string(), r#"{"limit":5}"#.to_string())]
    );
    let text = "<tool_call>\n<function=search>\n<parameter=paths>\n[\"a\"]\n</param";
    assert_eq!(
        parse_all(tools(), None, text).1,
        vec![("search".to_string(), r#"{"paths":["a"]}"#.to_string())]
    );
    let text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nBerlin\n</para";
    assert_eq!(
        parse_all(tools(), None, text).1,
        vec![(
            "get_weather".to_string(),
            r#"{"city":"Berlin"}"#.to_string()
        )]
    );
}

#[test]
fn untyped_values_and_invalid_json_fall_back_to_strings() {
    let text = "<tool_call>\n<function=get_weather>\n<parameter=days>\nthree\n</parameter>\n<parameter=extra>\n42\n</parameter>\n</function>\n</tool_call>";
    assert_eq!(
        parse_all(tools(), None, text).1,
        vec![(
            "get_weather".to_string(),
            r#"{"days":"three","extra":"42"}"#.to_string()
        )]
    );
    // A string keeps inner and outer whitespace except the template's one newline each side.
    let text = "<tool_call>\n<function=get_weather>\n<parameter=city>\n\n  x  \n\n</parameter>\n</function>\n</tool_call>";
    assert_eq!(
        parse_all(tools(), None, text).1,
        vec![(
            "get_weather".to_string(),
            r#"{"city":"\n  x  \n"}"#.to_string()
        )]
    );
}

#[test]
fn max_calls_drops_later_calls() {
    let (content, calls) = feed_pieces(&[SAMPLE], Some(1));
    assert_eq!(content, "Let me check — two lookups.");
    assert_eq!(calls, expected_sample().1[..1].to_vec());
}

#[test]
fn whitespace_only_content_around_calls_is_dropped() {
    let text = "\n\n<tool_call>\n<function=now>\n</function>\n</tool_call>\n\n";
    assert_eq!(
        parse_all(tools(), None, text),
        (String::new(), vec![("now".to_string(), "{}".to_string())])
    );
}
