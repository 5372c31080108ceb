//! The speech vocabulary, derived from the tokenizer rather than assumed.
//!
//! NeuTTS-air has 65,536 `<|speech_N|>` tokens in one contiguous block; the first id differs between
//! tokenizers (151,671 on the real one). A tokenizer that breaks that layout would make every code
//! wrong silently, so it is refused here with the first id that breaks it.

use tokenizers::Tokenizer;

/// How many speech codes NeuCodec has (its FSQ codebook).
pub const SPEECH_CODES: u32 = 65_536;

pub const SPEECH_GENERATION_END: &str = "<|SPEECH_GENERATION_END|>";
pub const SPEECH_GENERATION_START: &str = "<|SPEECH_GENERATION_START|>";
pub const TEXT_PROMPT_START: &str = "<|TEXT_PROMPT_START|>";
pub const TEXT_PROMPT_END: &str = "<|TEXT_PROMPT_END|>";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VocabError {
    #[error("the tokenizer has no {0} token")]
    MissingToken(String),
    #[error(
        "speech tokens are not contiguous: <|speech_{code}|> has id {found}, expected {expected}"
    )]
    NotContiguous {
        code: u32,
        found: u32,
        expected: u32,
    },
    #[error(
        "the tokenizer has {found} speech tokens, expected exactly {SPEECH_CODES} (<|speech_0|>..<|speech_65535|>)"
    )]
    WrongCount { found: u32 },
}

/// Ids the prompt and the sampler need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpeechVocab {
    /// Id of `<|speech_0|>`; code `c` is id `first + c`.
    pub first: u32,
    pub end: u32,
    pub generation_start: u32,
    pub text_prompt_start: u32,
    pub text_prompt_end: u32,
}

fn speech_token(code: u32) -> String {
    format!("<|speech_{code}|>")
}

impl SpeechVocab {
    pub fn from_tokenizer(tok: &Tokenizer) -> Result<Self, VocabError> {
        let id = |name: &str| {
            tok.token_to_id(name)
                .ok_or_else(|| VocabError::MissingToken(name.to_owned()))
        };
        let first = id(&speech_token(0))?;
        for code in 1..SPEECH_CODES {
            let expected = first + code;
            match tok.token_to_id(&speech_token(code)) {
                Some(found) if found == expected => {}
                Some(found) => {
                    return Err(VocabError::NotContiguous {
                        code,
                        found,
                        expected,
                    });
                }
                None => return Err(VocabError::WrongCount { found: code }),
            }
        }
        if tok.token_to_id(&speech_token(SPEECH_CODES)).is_some() {
            let mut found = SPEECH_CODES;
            while tok.token_to_id(&speech_token(found)).is_some() {
                found += 1;
            }
            return Err(VocabError::WrongCount { found });
        }
        Ok(Self {
            first,
            end: id(SPEECH_GENERATION_END)?,
            generation_start: id(SPEECH_GENERATION_START)?,
            text_prompt_start: id(TEXT_PROMPT_START)?,
            text_prompt_end: id(TEXT_PROMPT_END)?,
        })
    }

    /// One past the last speech id.
    pub fn speech_end_exclusive(&self) -> u32 {
        self.first + SPEECH_CODES
    }

    pub fn code_to_id(&self, code: u32) -> u32 {
        self.first + code
    }

    /// The code of a speech id, `None` for any other id.
    pub fn id_to_code(&self, id: u32) -> Option<u32> {
        (id >= self.first && id < self.speech_end_exclusive()).then(|| id - self.first)
    }
}
