//! `genai_config.json` in the onnxruntime-genai schema: the part of it this project uses.
//!
//! Unknown fields are accepted (real packages carry many), known ones are type-checked, and the
//! cross-field rules (heads x head size, vocab width) are checked in [`GenaiConfig::validate`].

use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Deserialize)]
pub struct GenaiConfig {
    pub model: ModelSection,
    #[serde(default)]
    pub search: SearchSection,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ModelSection {
    #[serde(rename = "type")]
    pub model_type: String,
    pub context_length: usize,
    pub vocab_size: usize,
    #[serde(default)]
    pub bos_token_id: Option<u32>,
    #[serde(default)]
    pub eos_token_id: TokenIds,
    #[serde(default)]
    pub pad_token_id: Option<u32>,
    pub decoder: DecoderSection,
}

/// `eos_token_id` is a number or a list in the wild.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(untagged)]
pub enum TokenIds {
    #[default]
    None,
    One(u32),
    Many(Vec<u32>),
}

impl TokenIds {
    pub fn to_vec(&self) -> Vec<u32> {
        match self {
            TokenIds::None => Vec::new(),
            TokenIds::One(id) => vec![*id],
            TokenIds::Many(ids) => ids.clone(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct DecoderSection {
    pub filename: String,
    #[serde(default)]
    pub session_options: SessionOptions,
    pub head_size: usize,
    pub hidden_size: usize,
    pub num_attention_heads: usize,
    pub num_hidden_layers: usize,
    pub num_key_value_heads: usize,
    #[serde(default)]
    pub inputs: InputNames,
    #[serde(default)]
    pub outputs: OutputNames,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct SessionOptions {
    #[serde(default)]
    pub log_id: Option<String>,
    #[serde(default)]
    pub intra_op_num_threads: Option<usize>,
    #[serde(default)]
    pub inter_op_num_threads: Option<usize>,
    #[serde(default)]
    pub graph_optimization_level: Option<String>,
    /// A list of `{provider name: {option: value}}`, as OGA writes it.
    #[serde(default)]
    pub provider_options: Vec<BTreeMap<String, BTreeMap<String, String>>>,
    /// Session config entries OGA adds as they are (`AddConfigEntry`).
    #[serde(default)]
    pub config_entries: BTreeMap<String, String>,
    /// A custom-op library OGA registers (`RegisterCustomOpsLibrary`); relative to the package.
    #[serde(default)]
    pub custom_ops_library: Option<String>,
    /// ONNX Runtime's session log severity (0 verbose .. 4 fatal) and verbosity, as OGA applies
    /// them: what the session logs at this level or above reaches our log.
    #[serde(default)]
    pub log_severity_level: Option<i32>,
    #[serde(default)]
    pub log_verbosity_level: Option<i32>,
    /// A profile file prefix: ONNX Runtime writes a JSON trace of the session (OGA's knob).
    #[serde(default)]
    pub enable_profiling: Option<String>,
    #[serde(default)]
    pub enable_mem_pattern: Option<bool>,
    #[serde(default)]
    pub enable_cpu_mem_arena: Option<bool>,
    /// Any other key: onnxruntime-genai adds it as a session config entry as it is
    /// (config.cpp, `SessionOptions_Element::OnValue`), so we do too.
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

impl SessionOptions {
    /// Provider names in the order the config lists them.
    pub fn providers(&self) -> Vec<&str> {
        self.provider_options
            .iter()
            .flat_map(|m| m.keys().map(String::as_str))
            .collect()
    }

    pub fn provider(&self, name: &str) -> Option<&BTreeMap<String, String>> {
        self.provider_options.iter().find_map(|m| m.get(name))
    }

    /// The RyzenAI entry of `provider_options` (OGA's provider name is `RyzenAI`; any case), whose
    /// options go to the RyzenAI provider as they are (e.g. `hybrid_opt_token_backend=npu`).
    pub fn ryzenai(&self) -> Option<&BTreeMap<String, String>> {
        self.provider_options.iter().find_map(|m| {
            m.iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(RYZENAI_PROVIDER_KEY))
                .map(|(_, v)| v)
        })
    }

    /// Session config entries: `config_entries`, then every key this struct does not know, as
    /// onnxruntime-genai adds them (strings as they are, numbers and booleans as JSON text).
    pub fn all_config_entries(&self) -> BTreeMap<String, String> {
        let mut out = self.config_entries.clone();
        for (k, v) in &self.other {
            let v = match v {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            out.insert(k.clone(), v);
        }
        out
    }

    /// Whether the config declares the RyzenAI provider (the NPU route's first condition).
    pub fn declares_ryzenai(&self) -> bool {
        self.ryzenai().is_some()
    }
}

/// The provider name OGA's genai_config.json uses for AMD's RyzenAI provider.
pub const RYZENAI_PROVIDER_KEY: &str = "RyzenAI";

#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct InputNames {
    pub input_ids: String,
    pub attention_mask: String,
    pub position_ids: String,
    pub past_key_names: String,
    pub past_value_names: String,
}

impl Default for InputNames {
    fn default() -> Self {
        Self {
            input_ids: "input_ids".into(),
            attention_mask: "attention_mask".into(),
            position_ids: "position_ids".into(),
            past_key_names: "past_key_values.%d.key".into(),
            past_value_names: "past_key_values.%d.value".into(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct OutputNames {
    pub logits: String,
    pub present_key_names: String,
    pub present_value_names: String,
}

impl Default for OutputNames {
    fn default() -> Self {
        Self {
            logits: "logits".into(),
            present_key_names: "present.%d.key".into(),
            present_value_names: "present.%d.value".into(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct SearchSection {
    pub max_length: Option<usize>,
    pub past_present_share_buffer: bool,
    /// Prefill in runs of at most this many tokens (onnxruntime-genai's `search.chunk_size`; 0 or
    /// absent: one run). AMD's long-context NPU packages set it with the provider's own chunking.
    #[serde(deserialize_with = "positive_or_none")]
    pub chunk_size: Option<usize>,
    pub do_sample: bool,
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_length: usize,
}

impl Default for SearchSection {
    fn default() -> Self {
        Self {
            max_length: None,
            past_present_share_buffer: false,
            chunk_size: None,
            do_sample: false,
            temperature: 1.0,
            top_k: 50,
            top_p: 1.0,
            min_length: 0,
        }
    }
}

/// A count where onnxruntime-genai treats 0 or a negative number as "off" (it reads a double).
fn positive_or_none<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    let v = Option::<f64>::deserialize(d)?;
    Ok(v.filter(|v| *v >= 1.0).map(|v| v as usize))
}

/// Expands an OGA name pattern (`past_key_values.%d.key`) for one layer.
pub fn layer_name(pattern: &str, layer: usize) -> String {
    pattern.replace("%d", &layer.to_string())
}

impl GenaiConfig {
    /// Cross-field checks; each message says what was expected.
    pub fn validate(&self) -> Result<(), String> {
        let d = &self.model.decoder;
        if d.num_hidden_layers == 0 {
            return Err("decoder.num_hidden_layers is 0".into());
        }
        if d.num_key_value_heads == 0
            || !d.num_attention_heads.is_multiple_of(d.num_key_value_heads)
        {
            return Err(format!(
                "decoder.num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
                d.num_attention_heads, d.num_key_value_heads
            ));
        }
        // No rule ties heads x head_size to hidden_size: Qwen3 (NeuTTS-2E's family) sets its
        // head_dim apart (16 heads of 128 over a hidden size of 1024), as onnxruntime-genai allows.
        if d.head_size == 0 || d.hidden_size == 0 {
            return Err("decoder.head_size and hidden_size must be positive".into());
        }
        for p in [
            &d.inputs.past_key_names,
            &d.inputs.past_value_names,
            &d.outputs.present_key_names,
            &d.outputs.present_value_names,
        ] {
            if !p.contains("%d") {
                return Err(format!("name pattern {p:?} has no %d for the layer index"));
            }
        }
        if self.model.context_length == 0 {
            return Err("model.context_length is 0".into());
        }
        // onnxruntime-genai refuses this at generator creation ("max_length cannot be greater
        // than model context_length"); a missing or 0 max_length means context_length.
        if let Some(m) = self.search.max_length
            && m > self.model.context_length
        {
            return Err(format!(
                "search.max_length ({m}) cannot be greater than model.context_length ({})",
                self.model.context_length
            ));
        }
        Ok(())
    }

    /// Total tokens (prompt + generated) one sequence may hold: `search.max_length`, which
    /// defaults to `model.context_length` as in onnxruntime-genai.
    pub fn token_budget(&self) -> usize {
        match self.search.max_length {
            Some(m) if m > 0 => m.min(self.model.context_length),
            _ => self.model.context_length,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(search: serde_json::Value) -> GenaiConfig {
        serde_json::from_value(serde_json::json!({
            "model": {
                "type": "qwen2", "context_length": 4096, "vocab_size": 100, "eos_token_id": 1,
                "decoder": {"filename": "model.onnx", "head_size": 4, "hidden_size": 8,
                    "num_attention_heads": 2, "num_hidden_layers": 1, "num_key_value_heads": 1}
            },
            "search": search,
        }))
        .expect("config")
    }

    #[test]
    fn search_fields_as_onnxruntime_genai_reads_them() {
        // A shared buffer without max_length: onnxruntime-genai takes context_length.
        let c = config(serde_json::json!({"past_present_share_buffer": true}));
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(c.token_budget(), 4096);
        // max_length above the context is refused, as onnxruntime-genai refuses it.
        let c = config(serde_json::json!({"max_length": 5000}));
        assert_eq!(
            c.validate(),
            Err(
                "search.max_length (5000) cannot be greater than model.context_length (4096)"
                    .into()
            )
        );
        assert_eq!(
            config(serde_json::json!({"max_length": 1024})).token_budget(),
            1024
        );
        // chunk_size: a positive number turns chunking on; 0 or less leaves it off.
        assert_eq!(
            config(serde_json::json!({"chunk_size": 256}))
                .search
                .chunk_size,
            Some(256)
        );
        assert_eq!(
            config(serde_json::json!({"chunk_size": 0}))
                .search
                .chunk_size,
            None
        );
        assert_eq!(
            config(serde_json::json!({"chunk_size": -4}))
                .search
                .chunk_size,
            None
        );
        assert_eq!(config(serde_json::json!({})).search.chunk_size, None);
    }
}
