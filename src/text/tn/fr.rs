//! French text before the FST grammars: damga 1.0.5's pre-hook (`damga/fr/tn/normalizer.py`, `prepare`) ported
//! regex for regex. damga's French normalizer has no post step.

use super::pyre::{PyRegex, group, sub};

/// damga's French pre-hook, then our overrides (none: damga reads "12/05/2026", "12.05.2026" and "2026-05-12" as
/// "douze mai deux mille vingt-six").
pub(super) fn prepare(text: &str) -> String {
    let text = sub(ISO_DATE.for_text(text), text, |c| {
        format!("{}/{}/{}", group(c, 3), group(c, 2), group(c, 1))
    });
    sub(FEM.for_text(&text), &text, |c| {
        let number = group(c, 1);
        if number.ends_with("11") {
            number.to_string()
        } else {
            format!("{FEM_MARK}{number}")
        }
    })
}

/// damga's French post step: it has none.
pub(super) fn finish(text: &str) -> String {
    text.to_string()
}

// damga/fr/lexicon.py: the mark the grammars read before a feminine number.
const FEM_MARK: &str = "\u{2064}";

// Feminine nouns: a number ending in 1 before one of them takes "une" (21 voix → vingt et une voix).
const FEMININE: &str = "heure heures fois personne personnes voix année années semaine semaines minute minutes
seconde secondes tonne tonnes page pages femme femmes fille filles entreprise entreprises région régions nation
nations victime victimes langue langues proposition propositions mesure mesures journée journées place places voiture
voitures famille familles école écoles ville villes maison maisons mission missions question questions raison raisons
étape étapes priorité priorités condition conditions recommandation recommandations règle règles directive directives
résolution résolutions décision décisions organisation organisations institution institutions délégation délégations
session sessions séance séances réunion réunions conférence conférences élection élections réforme réformes action
actions initiative initiatives livre livres victoire victoires voie voies chance chances fin zone zones agence agences
communauté communautés ligne lignes";

static FEM: PyRegex = PyRegex::new(|| {
    let nouns: Vec<&str> = FEMININE.split_whitespace().collect();
    format!(r"(?<![\d,.\w])(\d*1)(?= (?:{})\b)", nouns.join("|"))
});
static ISO_DATE: PyRegex =
    PyRegex::new(|| r"\b((?:1[5-9]|20)\d\d)-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])\b".into());

#[cfg(test)]
mod tests {
    use super::*;

    /// Inputs already through damga's `preprocess(text, lowercase=False)`; outputs of damga 1.0.5's
    /// `damga.fr.tn.normalizer.prepare`.
    const PARITY: &[(&str, &str)] = &[
        (
            "Il y a 21 voix et 31 personnes.",
            "Il y a \u{2064}21 voix et \u{2064}31 personnes.",
        ),
        (
            "Le 2026-05-12 et le 1999-12-31, pas le 1499-12-31 ni 2026-13-01.",
            "Le 12/05/2026 et le 31/12/1999, pas le 1499-12-31 ni 2026-13-01.",
        ),
        (
            "Elle a 1 heure, 11 heures et 111 pages.",
            "Elle a \u{2064}1 heure, 11 heures et 111 pages.",
        ),
        (
            "On compte 101 femmes, 1001 années et 211 villes.",
            "On compte \u{2064}101 femmes, \u{2064}1001 années et 211 villes.",
        ),
        (
            "Pas 2,1 tonnes ni 3.1 pages ni x1 page.",
            "Pas 2,1 tonnes ni 3.1 pages ni x1 page.",
        ),
        (
            "Voici 41 fois et 51 foisons.",
            "Voici \u{2064}41 fois et 51 foisons.",
        ),
        (
            "La 1 fin, la 61 zone et 71 zones.",
            "La \u{2064}1 fin, la \u{2064}61 zone et \u{2064}71 zones.",
        ),
        (
            "Le 2026-05-12T10:00 et 12026-05-12 et 2026-05-123.",
            "Le 2026-05-12T10:00 et 12026-05-12 et 2026-05-123.",
        ),
        (
            "Environ 81 entreprises et 91 régions.",
            "Environ \u{2064}81 entreprises et \u{2064}91 régions.",
        ),
        (
            "À 1 heure du matin, 1 heures.",
            "À \u{2064}1 heure du matin, \u{2064}1 heures.",
        ),
        ("1 voix", "\u{2064}1 voix"),
        (
            "Les 21 Voix et les 21 voix.",
            "Les 21 Voix et les \u{2064}21 voix.",
        ),
        (
            "Le 2008-02-17-3 et 1.2008-02-17.",
            "Le 17/02/2008-3 et 1.17/02/2008.",
        ),
        (
            "Il reste 11 semaines, 21 semaines, 1 semaine.",
            "Il reste 11 semaines, \u{2064}21 semaines, \u{2064}1 semaine.",
        ),
        (
            "Les 1 000 écoles et 1 001 écoles.",
            "Les 1 000 écoles et 1 \u{2064}001 écoles.",
        ),
        (
            "Elles ont 61 ans et 61 langues.",
            "Elles ont 61 ans et \u{2064}61 langues.",
        ),
        ("Les 1er mai et 2e place.", "Les 1er mai et 2e place."),
        (
            "M. Dupont a 71 ans et 81 décisions.",
            "M. Dupont a 71 ans et \u{2064}81 décisions.",
        ),
        (
            "Voici 21 ligne_s et 21 lignes.",
            "Voici 21 ligne_s et \u{2064}21 lignes.",
        ),
        (
            "Le 12/05/2026 et le 31 réunions.",
            "Le 12/05/2026 et le \u{2064}31 réunions.",
        ),
        ("Il y a 141 délégations.", "Il y a \u{2064}141 délégations."),
        (
            "Prenez 1 place, 21 places, ou 1 placement.",
            "Prenez \u{2064}1 place, \u{2064}21 places, ou 1 placement.",
        ),
        (
            "21 séances, 31 sessions, 41 élections.",
            "\u{2064}21 séances, \u{2064}31 sessions, \u{2064}41 élections.",
        ),
        ("Le ٢١ voix et 1٢1 voix.", "Le ٢١ voix et \u{2064}1٢1 voix."),
    ];

    #[test]
    fn parity_with_damga() {
        for (input, expected) in PARITY {
            assert_eq!(prepare(input), *expected, "input: {input:?}");
        }
    }

    #[test]
    fn no_post_step() {
        assert_eq!(finish("vingt et une voix"), "vingt et une voix");
    }
}
