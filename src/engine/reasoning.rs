//! The reasoning phase of one request's reply (thinking models), at the token level: where the
//! reasoning block starts and ends, the budget that closes it by forcing its closing tokens
//! (`--max-thinking-tokens`), and when a request's grammar starts to apply (after the block:
//! a constrained judge reasons freely, then answers in its format).
//!
//! The engine builds a [`ReasoningGate`] from the chat template's family
//! ([`crate::text::reasoning::ReasoningFormat`]) and the tokenizer; the scheduler asks a
//! [`GateState`] each step whether the next token is forced and whether the grammar applies.
//! Everything here depends only on the request's own tokens, so the determinism contract
//! holds. This module does not split text (that is `text::reasoning`).

/// How a request's reply reasons before it answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReasoningGate {
    /// The reply starts inside its reasoning (the prompt opened `<think>`, or Harmony).
    pub starts_open: bool,
    /// The ids that open the block when the reply opens it itself (`<think>`); empty when the
    /// reply never opens one. Only the first id is watched for.
    pub open: Vec<u32>,
    /// The ids after which the answer begins (`</think>`; Harmony's final-channel header).
    pub close: Vec<u32>,
    /// The ids forced when the budget is reached (the close and what follows it).
    pub forced_close: Vec<u32>,
    /// Reasoning tokens allowed before the close is forced; `None`: no budget.
    pub budget: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The first token decides: the open id starts reasoning, anything else is the answer.
    Undecided,
    Reasoning,
    /// The budget was reached: forcing `forced_close[i]` next.
    Forcing(usize),
    Answer,
}

/// One request's position relative to its reasoning block.
#[derive(Debug, Clone)]
pub struct GateState {
    gate: ReasoningGate,
    phase: Phase,
    /// Tokens generated inside the block (forced ones excluded).
    reasoning_tokens: usize,
    /// The latest tokens inside the block, to find the close.
    tail: Vec<u32>,
}

impl GateState {
    pub fn new(gate: ReasoningGate) -> GateState {
        let phase = if gate.starts_open {
            Phase::Reasoning
        } else if gate.open.is_empty() {
            Phase::Answer
        } else {
            Phase::Undecided
        };
        GateState {
            gate,
            phase,
            reasoning_tokens: 0,
            tail: Vec::new(),
        }
    }

    /// The token the next step must produce, when the budget closes the block.
    pub fn forced(&self) -> Option<u32> {
        match self.phase {
            Phase::Reasoning if self.gate.budget.is_some_and(|b| self.reasoning_tokens >= b) => {
                self.gate.forced_close.first().copied()
            }
            Phase::Forcing(i) => self.gate.forced_close.get(i).copied(),
            _ => None,
        }
    }

    /// Whether a grammar constrains the next token: in the answer, and on the first token of
    /// a reply that may still open its block (then the open id is allowed beside the
    /// grammar's, see [`GateState::open_choice`]).
    pub fn grammar_applies(&self) -> bool {
        matches!(self.phase, Phase::Answer | Phase::Undecided)
    }

    /// The id allowed beside the grammar's on a reply's first token: the block's open.
    pub fn open_choice(&self) -> Option<u32> {
        match self.phase {
            Phase::Undecided => self.gate.open.first().copied(),
            _ => None,
        }
    }

    /// Whether the reply is inside its reasoning block now.
    pub fn in_reasoning(&self) -> bool {
        matches!(self.phase, Phase::Reasoning | Phase::Forcing(_))
    }

    /// Reasoning tokens generated so far (forced ones excluded).
    pub fn reasoning_tokens(&self) -> usize {
        self.reasoning_tokens
    }

    /// Advances past the reply's next token; returns whether the token belongs to the answer
    /// (and so to the grammar).
    pub fn consume(&mut self, tok: u32) -> bool {
        match self.phase {
            Phase::Answer => true,
            Phase::Undecided => {
                if self.gate.open.first() == Some(&tok) {
                    self.phase = Phase::Reasoning;
                    false
                } else {
                    self.phase = Phase::Answer;
                    true
                }
            }
            Phase::Reasoning => {
                if self.forced() == Some(tok) {
                    self.advance_forcing(0);
                    return false;
                }
                self.reasoning_tokens += 1;
                self.tail.push(tok);
                let keep = self.gate.close.len();
                if self.tail.len() > keep {
                    self.tail.drain(..self.tail.len() - keep);
                }
                if !self.gate.close.is_empty() && self.tail == self.gate.close {
                    self.phase = Phase::Answer;
                }
                false
            }
            Phase::Forcing(i) => {
                self.advance_forcing(i);
                false
            }
        }
    }

    fn advance_forcing(&mut self, i: usize) {
        self.phase = if i + 1 >= self.gate.forced_close.len() {
            Phase::Answer
        } else {
            Phase::Forcing(i + 1)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPEN: u32 = 10;
    const CLOSE: u32 = 11;
    const NL: u32 = 12;

    fn gate(starts_open: bool, budget: Option<usize>) -> GateState {
        GateState::new(ReasoningGate {
            starts_open,
            open: vec![OPEN],
            close: vec![CLOSE],
            forced_close: vec![CLOSE, NL],
            budget,
        })
    }

    /// Drives a gate with a script of "model" tokens (taken whenever nothing is forced);
    /// returns the reply and, per token, whether it went to the grammar.
    fn drive(mut g: GateState, script: &[u32], n: usize) -> (Vec<u32>, Vec<bool>, GateState) {
        let mut out = Vec::new();
        let mut to_grammar = Vec::new();
        let mut script = script.iter().copied();
        while out.len() < n {
            let tok = match g.forced() {
                Some(t) => t,
                None => match script.next() {
                    Some(t) => t,
                    None => break,
                },
            };
            to_grammar.push(g.consume(tok));
            out.push(tok);
        }
        (out, to_grammar, g)
    }

    #[test]
    fn a_reply_that_opens_its_block_reasons_then_answers() {
        let (out, grammar, g) = drive(gate(false, None), &[OPEN, 1, 2, CLOSE, NL, 3], 10);
        assert_eq!(out, vec![OPEN, 1, 2, CLOSE, NL, 3]);
        assert_eq!(grammar, vec![false, false, false, false, true, true]);
        assert_eq!(g.reasoning_tokens(), 3);
        assert!(!g.in_reasoning());
    }

    #[test]
    fn a_reply_without_a_block_is_all_answer() {
        let (_, grammar, g) = drive(gate(false, Some(1)), &[5, 6, 7], 10);
        assert_eq!(grammar, vec![true, true, true]);
        assert_eq!(g.reasoning_tokens(), 0);
    }

    #[test]
    fn the_budget_forces_the_close_deterministically() {
        // The prompt opened the block; 3 reasoning tokens, then `</think>\n\n` is forced
        // whatever the model would say, then the model answers.
        let (out, grammar, g) = drive(gate(true, Some(3)), &[1, 2, 3, 4, 5, 6], 10);
        assert_eq!(out, vec![1, 2, 3, CLOSE, NL, 4, 5, 6]);
        assert_eq!(
            grammar,
            vec![false, false, false, false, false, true, true, true]
        );
        assert_eq!(g.reasoning_tokens(), 3);
        // A budget of zero closes the block at once.
        let (out, _, _) = drive(gate(true, Some(0)), &[1, 2], 10);
        assert_eq!(out, vec![CLOSE, NL, 1, 2]);
        // A model that closes within its budget is never forced.
        let (out, _, _) = drive(gate(true, Some(3)), &[1, CLOSE, 9], 10);
        assert_eq!(out, vec![1, CLOSE, 9]);
    }

    #[test]
    fn a_reply_cut_inside_its_block_is_still_reasoning() {
        let (_, _, g) = drive(gate(true, None), &[1, 2, 3, 4], 3);
        assert!(g.in_reasoning());
        let (_, _, g) = drive(gate(true, Some(2)), &[1, 2, 3, 4], 3);
        assert!(g.in_reasoning(), "cut while the close was being forced");
    }

    #[test]
    fn multi_token_closes_are_found() {
        // Harmony: the answer begins after <|channel|> final <|message|> (20, 21, 22).
        let mut g = GateState::new(ReasoningGate {
            starts_open: true,
            open: Vec::new(),
            close: vec![20, 21, 22],
            forced_close: vec![23, 24, 20, 21, 22],
            budget: None,
        });
        for t in [20, 1, 2, 23, 24, 20, 21] {
            assert!(!g.consume(t));
        }
        assert!(!g.consume(22));
        assert!(g.consume(7));
        assert!(g.grammar_applies());
    }
}
