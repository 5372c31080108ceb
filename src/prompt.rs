//! The NeuTTS prompt: text parts and reference codes -> token ids, exactly as the vendor's
//! `_apply_chat_template` builds them (../shared/golden/prompts.json decides any doubt).
//!
//! This stage takes text that the front end already prepared (phonemes for the "phonemes" format,
//! normalised text for "BPE"); it only tokenizes and splices.

use tokenizers::Tokenizer;

// The input format is the package's property (genai_config.json or its manifest says it);
// prompts are built for it.
pub use crate::package::InputFormat;
use crate::package::SpeechVocab;

#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    #[error("tokenizer: {0}")]
    Tokenize(String),
    #[error("reference code {0} is outside 0..65535")]
    CodeOutOfRange(u32),
    #[error("emotion tokens are only read by BPE-format models")]
    EmotionNeedsBpe,
    #[error("the model has no emotion token {0}")]
    UnknownEmotion(String),
}

/// What goes into one prompt. `ref_text` and `text` are already in the model's input format.
#[derive(Debug, Clone, Copy)]
pub struct PromptInput<'a> {
    pub format: InputFormat,
    pub ref_text: &'a str,
    pub text: &'a str,
    pub ref_codes: &'a [u32],
    /// An emotion name ("happy" -> `<|HAPPY|>`), BPE models only.
    pub emotion: Option<&'a str>,
}

fn encode(tok: &Tokenizer, text: &str) -> Result<Vec<u32>, PromptError> {
    tok.encode(text, false)
        .map(|e| e.get_ids().to_vec())
        .map_err(|e| PromptError::Tokenize(e.to_string()))
}

/// Builds the prompt ids; generation continues right after the last reference code.
pub fn build(
    tok: &Tokenizer,
    vocab: &SpeechVocab,
    input: &PromptInput<'_>,
) -> Result<Vec<u32>, PromptError> {
    build_shared(tok, vocab, input).map(|(ids, _)| ids)
}

/// [`build`], and how many of the ids come before anything of the request's own text: the
/// instruction and the voice's transcript, the same for every request of the voice (and
/// emotion). Where the tokenizer joins the transcript's last word with what follows, the count
/// stops before it.
pub fn build_shared(
    tok: &Tokenizer,
    vocab: &SpeechVocab,
    input: &PromptInput<'_>,
) -> Result<(Vec<u32>, usize), PromptError> {
    let mut ids = Vec::with_capacity(input.ref_codes.len() + 64 + input.text.len());
    // The joined "transcript text" tokens agree with the transcript's own up to here.
    let transcript_part = |joined: &[u32]| -> Result<usize, PromptError> {
        let alone = encode(tok, input.ref_text)?;
        Ok(alone.iter().zip(joined).take_while(|(a, b)| a == b).count())
    };
    let shared;
    match input.format {
        InputFormat::Phonemes => {
            if input.emotion.is_some() {
                return Err(PromptError::EmotionNeedsBpe);
            }
            // The vendor splits its template at the special markers; text between special tokens
            // tokenizes the same alone as in the whole string.
            ids.extend(encode(tok, "user: Convert the text to speech:")?);
            ids.push(vocab.text_prompt_start);
            let joined = encode(tok, &format!("{} {}", input.ref_text, input.text))?;
            shared = ids.len() + transcript_part(&joined)?;
            ids.extend(joined);
            ids.push(vocab.text_prompt_end);
            ids.extend(encode(tok, "\nassistant:")?);
        }
        InputFormat::Bpe => {
            ids.push(vocab.text_prompt_start);
            match input.emotion {
                None => {
                    let joined = encode(tok, &format!("{} {}", input.ref_text, input.text))?;
                    shared = ids.len() + transcript_part(&joined)?;
                    ids.extend(joined);
                }
                Some(emotion) => {
                    let token = crate::package::neuphonic::emotion_token(emotion);
                    let id = tok
                        .token_to_id(&token)
                        .ok_or(PromptError::UnknownEmotion(token))?;
                    ids.extend(encode(tok, input.ref_text)?);
                    ids.push(id);
                    shared = ids.len();
                    ids.extend(encode(tok, input.text)?);
                }
            }
            ids.push(vocab.text_prompt_end);
        }
    }
    ids.push(vocab.generation_start);
    for &code in input.ref_codes {
        if code >= crate::package::SPEECH_CODES {
            return Err(PromptError::CodeOutOfRange(code));
        }
        ids.push(vocab.code_to_id(code));
    }
    Ok((ids, shared))
}
