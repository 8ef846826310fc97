//! Tiers and verbs. A verb needs a minimum tier; the effective tier of a call is the minimum of
//! what the connection declares, the owner's per-agent max and the fleet ceiling.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    Observer,
    Member,
    Coordinator,
    Operator,
}

impl Tier {
    pub const ALL: [Tier; 4] = [
        Tier::Observer,
        Tier::Member,
        Tier::Coordinator,
        Tier::Operator,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Observer => "observer",
            Tier::Member => "member",
            Tier::Coordinator => "coordinator",
            Tier::Operator => "operator",
        }
    }

    pub fn parse(s: &str) -> Option<Tier> {
        Tier::ALL.into_iter().find(|t| t.as_str() == s)
    }
}

impl std::fmt::Display for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything an agent can ask the daemon to do. The gated verbs must pass the Work Gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Verb {
    Whoami,
    List,
    Sync,
    Note,
    Say,
    Reply,
    Send,
    Handoff,
    Done,
    Blocked,
    Decline,
    Circle,
    TaskCreate,
    TaskClaim,
    TaskShow,
    TaskCheck,
    TaskAmend,
    TaskSupersede,
    TaskCancel,
    TaskPropose,
    RoomCompose,
    SourceRead,
    OpBegin,
    OpEffect,
    OpResolve,
    EvidenceRegister,
    WakeTake,
}

impl Verb {
    pub const ALL: [Verb; 27] = [
        Verb::Whoami,
        Verb::List,
        Verb::Sync,
        Verb::Note,
        Verb::Say,
        Verb::Reply,
        Verb::Send,
        Verb::Handoff,
        Verb::Done,
        Verb::Blocked,
        Verb::Decline,
        Verb::Circle,
        Verb::TaskCreate,
        Verb::TaskClaim,
        Verb::TaskShow,
        Verb::TaskCheck,
        Verb::TaskAmend,
        Verb::TaskSupersede,
        Verb::TaskCancel,
        Verb::TaskPropose,
        Verb::RoomCompose,
        Verb::SourceRead,
        Verb::OpBegin,
        Verb::OpEffect,
        Verb::OpResolve,
        Verb::EvidenceRegister,
        Verb::WakeTake,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Whoami => "whoami",
            Verb::List => "list",
            Verb::Sync => "sync",
            Verb::Note => "note",
            Verb::Say => "say",
            Verb::Reply => "reply",
            Verb::Send => "send",
            Verb::Handoff => "handoff",
            Verb::Done => "done",
            Verb::Blocked => "blocked",
            Verb::Decline => "decline",
            Verb::Circle => "circle",
            Verb::TaskCreate => "task_create",
            Verb::TaskClaim => "task_claim",
            Verb::TaskShow => "task_show",
            Verb::TaskCheck => "task_check",
            Verb::TaskAmend => "task_amend",
            Verb::TaskSupersede => "task_supersede",
            Verb::TaskCancel => "task_cancel",
            Verb::TaskPropose => "task_propose",
            Verb::RoomCompose => "room_compose",
            Verb::SourceRead => "source_read",
            Verb::OpBegin => "op_begin",
            Verb::OpEffect => "op_effect",
            Verb::OpResolve => "op_resolve",
            Verb::EvidenceRegister => "evidence_register",
            Verb::WakeTake => "wake_take",
        }
    }

    pub fn parse(s: &str) -> Option<Verb> {
        Verb::ALL.into_iter().find(|v| v.as_str() == s)
    }

    /// One of the nine participant verbs that must pass the Work Gate, as such.
    pub fn gated(self) -> Option<GatedVerb> {
        Some(match self {
            Verb::Note => GatedVerb::Note,
            Verb::Say => GatedVerb::Say,
            Verb::Reply => GatedVerb::Reply,
            Verb::Send => GatedVerb::Send,
            Verb::Done => GatedVerb::Done,
            Verb::Blocked => GatedVerb::Blocked,
            Verb::Decline => GatedVerb::Decline,
            Verb::Handoff => GatedVerb::Handoff,
            Verb::Circle => GatedVerb::Circle,
            Verb::Whoami
            | Verb::List
            | Verb::Sync
            | Verb::TaskCreate
            | Verb::TaskClaim
            | Verb::TaskShow
            | Verb::TaskCheck
            | Verb::TaskAmend
            | Verb::TaskSupersede
            | Verb::TaskCancel
            | Verb::TaskPropose
            | Verb::RoomCompose
            | Verb::SourceRead
            | Verb::OpBegin
            | Verb::OpEffect
            | Verb::OpResolve
            | Verb::EvidenceRegister
            | Verb::WakeTake => return None,
        })
    }

    /// The nine participant verbs that must pass the Work Gate.
    pub fn is_gated(self) -> bool {
        self.gated().is_some()
    }

    /// The lowest effective tier that may use the verb.
    pub fn min_tier(self) -> Tier {
        match self {
            Verb::Whoami
            | Verb::List
            | Verb::Sync
            | Verb::TaskShow
            | Verb::RoomCompose
            | Verb::SourceRead => Tier::Observer,
            Verb::TaskCreate | Verb::TaskAmend | Verb::TaskSupersede | Verb::TaskCancel => {
                Tier::Coordinator
            }
            _ => Tier::Member,
        }
    }
}

impl std::fmt::Display for Verb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A contribution verb: one of the nine that must pass the Work Gate (DESIGN §6). Only these
/// reach a turn's planning, so a plan never meets a verb it has no rule for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GatedVerb {
    Note,
    Say,
    Reply,
    Send,
    Done,
    Blocked,
    Decline,
    Handoff,
    Circle,
}

impl GatedVerb {
    pub const ALL: [GatedVerb; 9] = [
        GatedVerb::Note,
        GatedVerb::Say,
        GatedVerb::Reply,
        GatedVerb::Send,
        GatedVerb::Done,
        GatedVerb::Blocked,
        GatedVerb::Decline,
        GatedVerb::Handoff,
        GatedVerb::Circle,
    ];

    pub fn as_str(self) -> &'static str {
        Verb::from(self).as_str()
    }
}

impl From<GatedVerb> for Verb {
    fn from(v: GatedVerb) -> Verb {
        match v {
            GatedVerb::Note => Verb::Note,
            GatedVerb::Say => Verb::Say,
            GatedVerb::Reply => Verb::Reply,
            GatedVerb::Send => Verb::Send,
            GatedVerb::Done => Verb::Done,
            GatedVerb::Blocked => Verb::Blocked,
            GatedVerb::Decline => Verb::Decline,
            GatedVerb::Handoff => Verb::Handoff,
            GatedVerb::Circle => Verb::Circle,
        }
    }
}

impl std::fmt::Display for GatedVerb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_nine_verbs_are_gated() {
        assert_eq!(Verb::ALL.iter().filter(|v| v.is_gated()).count(), 9);
        for v in Verb::ALL {
            assert_eq!(Verb::parse(v.as_str()), Some(v));
        }
    }

    #[test]
    fn gated_verbs_convert_both_ways() {
        for g in GatedVerb::ALL {
            assert_eq!(Verb::from(g).gated(), Some(g));
            assert_eq!(g.to_string(), Verb::from(g).to_string());
        }
        let gated: Vec<GatedVerb> = Verb::ALL.into_iter().filter_map(Verb::gated).collect();
        assert_eq!(gated.len(), GatedVerb::ALL.len());
    }
}
