//! The protocols' report figures, found by protocol name ([`figures`]): each protocol declares
//! its own in `bench/<name>/figures.rs`.

use super::figure::Figures;

/// The report figures of every protocol that declares them, in report order.
pub fn declared_figures() -> [Figures; 4] {
    [
        super::fbbench::figures::FIGURES,
        super::refutebench::figures::FIGURES,
        super::realmistake::figures::FIGURES,
        super::fennec::figures::FIGURES,
    ]
}

/// The figures `protocol` declares, if it does.
pub fn figures(protocol: &str) -> Option<Figures> {
    declared_figures()
        .into_iter()
        .find(|f| f.protocol == protocol)
}
