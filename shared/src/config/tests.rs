//! Tests for `config`: the real release config, the bare text form, and one test per rejection.

use super::*;

const REAL: &str = include_str!("../../../tests/fixtures/configs/qwen3.6-35b-a3b.config.json");

fn real_value() -> Value {
    serde_json::from_str(REAL).expect("fixture is JSON")
}

/// Applies `edit` to the real nested config and returns the parse error.
fn check_err(edit: impl FnOnce(&mut Value), expected: ConfigError) {
    let mut v = real_value();
    edit(&mut v);
    let got = parse_config(&v.to_string()).expect_err("config should be rejected");
    assert_eq!(got, expected);
}

fn text(v: &mut Value) -> &mut Map<String, Value> {
    v["text_config"]
        .as_object_mut()
        .expect("text_config object")
}

#[test]
fn real_release_config_parses() {
    let cfg = parse_config(REAL).expect("real config parses");
    assert_eq!(cfg.form, ConfigForm::Nested);
    let t = &cfg.text;
    assert_eq!(
        (t.hidden_size, t.num_layers, t.vocab_size),
        (2048, 40, 248320)
    );
    assert_eq!(t.n_full_attention_layers(), 10);
    for (i, ty) in t.layer_types.iter().enumerate() {
        let want = if i % 4 == 3 {
            LayerType::FullAttention
        } else {
            LayerType::LinearAttention
        };
        assert_eq!(*ty, want, "layer {i}");
    }
    assert_eq!(
        t.attention,
        AttentionLayout {
            n_q_heads: 16,
            n_kv_heads: 2,
            head_dim: 256,
            q_per_kv: 8,
            rotary_dims: 64
        }
    );
    assert_eq!(t.attention.q_proj_rows(), 8192);
    let dn = t.delta_net;
    assert_eq!(
        (
            dn.n_k_heads,
            dn.n_v_heads,
            dn.key_head_dim,
            dn.value_head_dim,
            dn.v_per_k
        ),
        (16, 32, 128, 128, 2)
    );
    assert_eq!(
        (dn.key_dim(), dn.value_dim(), dn.conv_dim(), dn.conv_kernel),
        (2048, 4096, 8192, 4)
    );
    assert_eq!(
        (t.num_experts, t.experts_per_token, t.moe_intermediate_size),
        (256, 8, 512)
    );
    assert_eq!(t.rope_theta, 1e7);
    assert_eq!(t.eos_token_ids, vec![248044]);
}

#[test]
fn bare_text_config_parses_and_synthesises_layer_types() {
    let mut v = real_value();
    let mut t = text(&mut v).clone();
    t.remove("layer_types");
    let cfg = parse_config(&Value::Object(t).to_string()).expect("bare text config parses");
    assert_eq!(cfg.form, ConfigForm::Text);
    assert_eq!(
        cfg.text.layer_types,
        parse_config(REAL).expect("real").text.layer_types
    );
}

#[test]
fn rope_scaling_alias_and_top_level_theta_are_accepted() {
    let mut v = real_value();
    let t = text(&mut v);
    let rope = t.remove("rope_parameters").expect("present");
    t.insert("rope_scaling".into(), rope);
    assert_eq!(
        parse_config(&v.to_string())
            .expect("parses")
            .text
            .rope_theta,
        1e7
    );

    let mut v = real_value();
    let t = text(&mut v);
    t.remove("rope_parameters");
    t.insert("rope_theta".into(), 5e6.into());
    assert_eq!(
        parse_config(&v.to_string())
            .expect("parses")
            .text
            .rope_theta,
        5e6
    );
}

#[test]
fn not_json() {
    assert!(matches!(parse_config("{oops"), Err(ConfigError::Json(_))));
}

#[test]
fn unsupported_model_type() {
    check_err(
        |v| v["model_type"] = "qwen3_moe".into(),
        ConfigError::UnsupportedModelType {
            field: "model_type".into(),
            found: "qwen3_moe".into(),
        },
    );
    check_err(
        |v| v["text_config"]["model_type"] = "llama".into(),
        ConfigError::UnsupportedModelType {
            field: "text_config.model_type".into(),
            found: "llama".into(),
        },
    );
}

#[test]
fn missing_fields_are_named() {
    check_err(
        |v| drop(text(v).remove("hidden_size")),
        ConfigError::Missing {
            field: "text_config.hidden_size".into(),
        },
    );
    check_err(
        |v| drop(v.as_object_mut().expect("obj").remove("text_config")),
        ConfigError::Missing {
            field: "text_config".into(),
        },
    );
    check_err(
        |v| {
            text(v).remove("layer_types");
            text(v).remove("full_attention_interval");
        },
        ConfigError::Missing {
            field: "text_config.layer_types (or text_config.full_attention_interval)".into(),
        },
    );
}

#[test]
fn wrong_types_are_named() {
    check_err(
        |v| v["text_config"]["num_experts"] = "256".into(),
        ConfigError::WrongType {
            field: "text_config.num_experts".into(),
            expected: "a non-negative integer",
            found: "\"256\"".into(),
        },
    );
    check_err(
        |v| v["text_config"]["rms_norm_eps"] = true.into(),
        ConfigError::WrongType {
            field: "text_config.rms_norm_eps".into(),
            expected: "a number",
            found: "true".into(),
        },
    );
}

#[test]
fn invalid_values_are_named() {
    type Edit = Box<dyn FnOnce(&mut Value)>;
    let cases: Vec<(Edit, &str)> = vec![
        (
            Box::new(|v| v["text_config"]["num_experts_per_tok"] = 300.into()),
            "text_config.num_experts_per_tok",
        ),
        (
            Box::new(|v| v["text_config"]["num_key_value_heads"] = 3.into()),
            "text_config.num_key_value_heads",
        ),
        (
            Box::new(|v| v["text_config"]["linear_num_value_heads"] = 24.into()),
            "text_config.linear_num_value_heads",
        ),
        (
            Box::new(|v| v["text_config"]["hidden_size"] = 0.into()),
            "text_config.hidden_size",
        ),
        (
            Box::new(|v| v["text_config"]["hidden_act"] = "gelu".into()),
            "text_config.hidden_act",
        ),
        (
            Box::new(|v| v["text_config"]["mlp_only_layers"] = serde_json::json!([0])),
            "text_config.mlp_only_layers",
        ),
        (
            Box::new(|v| v["tie_word_embeddings"] = true.into()),
            "tie_word_embeddings",
        ),
        (
            Box::new(|v| v["text_config"]["rope_parameters"]["rope_type"] = "yarn".into()),
            "text_config.rope_parameters.rope_type",
        ),
        (
            Box::new(|v| v["text_config"]["rope_parameters"]["partial_rotary_factor"] = 0.3.into()),
            "text_config.partial_rotary_factor",
        ),
        (
            Box::new(|v| v["text_config"]["eos_token_id"] = 300000.into()),
            "text_config.eos_token_id",
        ),
        (
            Box::new(|v| {
                let lt = v["text_config"]["layer_types"]
                    .as_array_mut()
                    .expect("array");
                lt.pop();
            }),
            "text_config.layer_types",
        ),
        (
            Box::new(|v| v["text_config"]["layer_types"][5] = "sliding".into()),
            "text_config.layer_types[5]",
        ),
    ];
    for (edit, field) in cases {
        let mut v = real_value();
        edit(&mut v);
        let err = parse_config(&v.to_string()).expect_err(field);
        assert!(
            matches!(&err, ConfigError::Invalid { field: f, .. } if f == field),
            "{field}: got {err:?}"
        );
    }
}
