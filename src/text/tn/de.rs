//! German text before the FST grammars: damga 1.0.5's pre-hook (`damga/de/tn/normalizer.py`, `prepare`) ported
//! regex for regex, with our own date and year rewrites in front of it. damga's German normalizer has no post step.

use fancy_regex::Captures;

use super::pyre::{PyRegex, group, py_int, py_strip, split, sub};

/// Our overrides, then damga's German pre-hook (the overrides must see the dates before damga's hook does).
pub(super) fn prepare(text: &str) -> String {
    damga_prepare(&de_overrides(text))
}

/// damga's German post step: it has none.
pub(super) fn finish(text: &str) -> String {
    text.to_string()
}

// ---------------------------------------------------------------------------------------------------------------
// Our overrides.

// Why: damga's grammar reads a numeric date "12.05.2026" as "zwölften fünften zwanzig sechsundzwanzig" and a bare
// year from 2020 on as "zwanzig sechsundzwanzig"; German says "zwölften Mai zweitausendsechsundzwanzig". Checked
// against damga 1.0.5: "12. Mai 2026" gets the month's name, years up to 2019 are read right ("zweitausendneunzehn",
// "neunzehnhundert…"), and a number behind damga's own NOT_YEAR mark is read as the cardinal
// ("zweitausendsechsundzwanzig"), also inside a date ("am 12. Mai ⁣2026"). So a numeric date is written out with the
// month's name, damga's ISO rewrites are done here first, and a free-standing year 2020–2099 gets the mark.
// The mark breaks the reading glued to letters or quotes ("2020er", "„2026“"), so only a year between spaces,
// brackets, sentence marks or a range dash gets it; "0151 2026 3344" (a phone number) does not.
static OV_NUM_DATE: PyRegex = PyRegex::new(|| {
    r"(?<![\w.,:/+])(0?[1-9]|[12]\d|3[01])\.(0?[1-9]|1[0-2])\.((?:1[1-9]|20)\d\d)(?!\w|[.,]\d)"
        .into()
});
// "12.05.2026-14.05.2026": damga reads a dash glued to "14. Mai" as "bis vierzehn." (no ordinal)
static OV_DATE_RANGE: PyRegex = PyRegex::new(|| {
    format!(
        r"(?<=\d)[-–](?=(?:[1-9]|[12]\d|3[01])\. (?:{}) )",
        MONTHS.join("|")
    )
});
static OV_YEAR: PyRegex = PyRegex::new(|| {
    r"(?<![\w.,:/+\x{2063}])(?<![^\d][-–])(?<!\d )(20[2-9]\d)(?=$|[\s)\]]|[.,;:!?](?!\d)|[-–]\d)(?! \d{3})"
        .into()
});

fn de_overrides(text: &str) -> String {
    let text = sub(ISO_DATE.for_text(text), text, iso_date);
    let text = sub(ISO_MONTH.for_text(&text), &text, iso_month);
    let text = sub(OV_NUM_DATE.for_text(&text), &text, |c| {
        match (py_int(group(c, 1)), month(group(c, 2))) {
            (Some(day), Some(name)) => format!("{day}. {name} {}", group(c, 3)),
            _ => group(c, 0).to_string(),
        }
    });
    let text = sub(OV_DATE_RANGE.for_text(&text), &text, |_| {
        " bis ".to_string()
    });
    sub(OV_YEAR.for_text(&text), &text, |c| {
        format!("{NOT_YEAR}{}", group(c, 1))
    })
}

// ---------------------------------------------------------------------------------------------------------------
// damga's pre-hook.

// damga/de/lexicon.py
const MONTHS: [&str; 12] = [
    "Januar",
    "Februar",
    "März",
    "April",
    "Mai",
    "Juni",
    "Juli",
    "August",
    "September",
    "Oktober",
    "November",
    "Dezember",
];
/// damga's mark before a four-digit number that counts, so the grammar does not read it as a year.
const NOT_YEAR: &str = "\u{2063}";

// A year-like number followed by a noun it counts is a cardinal: "1500 Menschen" → tausendfünfhundert.
const YEAR_WORDS: [&str; 23] = [
    "Jahr",
    "Jahre",
    "Jahres",
    "Jahren",
    "im",
    "seit",
    "bis",
    "von",
    "vor",
    "nach",
    "ab",
    "um",
    "Anfang",
    "Ende",
    "Mitte",
    "Sommer",
    "Herbst",
    "Winter",
    "Frühjahr",
    "Frühling",
    "zwischen",
    "und",
    "in",
];
static COUNT: PyRegex =
    PyRegex::new(|| r"(\S+ )?\b(1[1-9]\d\d|20[2-9]\d)(?= ([A-ZÄÖÜ][a-zäöüß]+))".into());
// After a word of quantity ("rund 1800") the number counts, whatever follows.
static QUANTITY: PyRegex = PyRegex::new(|| {
    concat!(
        r"\b((?:mehr|weniger) als|rund|fast|etwa|circa|ca\.|knapp|nur|allein|insgesamt|mindestens|",
        r"höchstens|bis zu) (1[1-9]\d\d|20[2-9]\d)\b(?! (?:Jahr|Jahre|Jahren)\b)"
    )
    .into()
});
static ISO_DATE: PyRegex =
    PyRegex::new(|| r"\b((?:1[5-9]|20)\d\d)-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])\b".into());
// 2003-03 → März 2003; a range of years runs upwards, so "2010-11" is not a month.
static ISO_MONTH: PyRegex =
    PyRegex::new(|| r"\b((?:1[5-9]|20)(\d\d))-(0[1-9]|1[0-2])\b(?![-–]?\d)".into());
// Letters glued to digits are split for the grammars: "CO2" → "CO 2", "25.Mai" → "25. Mai".
static LETTER_DIGIT: PyRegex = PyRegex::new(|| r"(?<=[A-Za-zÄÖÜäöüß])[—–-]?(?=\d)".into());
static DIGIT_LETTER: PyRegex = PyRegex::new(|| {
    r"(?<=\d)(?=[A-ZÄÖÜ]|[a-z]\b|(?:Millionen|Milliarden|Jahren?|Prozent)\b)".into()
});
static DOT_MONTH: PyRegex = PyRegex::new(|| {
    concat!(
        r"(?<=\d\.)(?=(?:Januar|Februar|März|April|Mai|Juni|Juli|August|September|Oktober|November|",
        r"Dezember)\b)"
    ).into()
});
// IBANs, e-mail and web addresses are read as written, so their letters and digits are not split.
static IBAN: PyRegex = PyRegex::new(|| {
    r"\b([A-Z]{2}\d{2}(?:(?: [A-Z0-9]{4}){2,7}(?: [A-Z0-9]{1,3})?|[A-Z0-9]{11,30}))\b".into()
});
static ADDRESS: PyRegex =
    PyRegex::new(|| r"((?:https?://|www\.)[^\s]*[^\s.,;:!?)]|[\w.+-]+@[\w-]+(?:\.[\w-]+)+)".into());

fn month(number: &str) -> Option<&'static str> {
    MONTHS
        .get(py_int(number)?.checked_sub(1)? as usize)
        .copied()
}

// an ISO date is read with the month's name
fn iso_date(c: &Captures) -> String {
    match (py_int(group(c, 3)), month(group(c, 2))) {
        (Some(day), Some(name)) => format!("{day}. {name} {}", group(c, 1)),
        _ => group(c, 0).to_string(),
    }
}

fn iso_month(c: &Captures) -> String {
    match (py_int(group(c, 3)), py_int(group(c, 2)), month(group(c, 3))) {
        (Some(m), Some(yy), Some(name)) if m <= yy => format!("{name} {}", group(c, 1)),
        _ => group(c, 0).to_string(),
    }
}

fn damga_prepare(text: &str) -> String {
    let text = sub(ISO_DATE.for_text(text), text, iso_date);
    let text = sub(ISO_MONTH.for_text(&text), &text, iso_month);
    // odd split pieces are IBAN candidates; kept whole when the bank grammar can spell them
    split(IBAN.for_text(&text), &text)
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            // the piece holds only A–Z, spaces and \d, where Python's isdigit() is is_numeric()
            if i % 2 == 1 && p.chars().filter(|c| c.is_numeric()).count() >= 8 {
                p.to_string()
            } else {
                prepare_plain(p)
            }
        })
        .collect()
}

fn prepare_plain(text: &str) -> String {
    split(ADDRESS.for_text(text), text)
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            if i % 2 == 1 {
                p.to_string()
            } else {
                prepare_text(p)
            }
        })
        .collect()
}

fn prepare_text(text: &str) -> String {
    let text = sub(LETTER_DIGIT.for_text(text), text, |_| " ".to_string());
    let text = sub(DIGIT_LETTER.for_text(&text), &text, |_| " ".to_string());
    let text = sub(DOT_MONTH.for_text(&text), &text, |_| " ".to_string());
    let text = sub(QUANTITY.for_text(&text), &text, |c| {
        format!("{} {NOT_YEAR}{}", group(c, 1), group(c, 2))
    });
    sub(COUNT.for_text(&text), &text, mark).replace(&NOT_YEAR.repeat(2), NOT_YEAR)
}

fn mark(c: &Captures) -> String {
    let (prev, next) = (group(c, 1), group(c, 3));
    if YEAR_WORDS.contains(&py_strip(prev)) || MONTHS.contains(&next) {
        return group(c, 0).to_string();
    }
    format!("{prev}{NOT_YEAR}{}", group(c, 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inputs already through damga's `preprocess(text, lowercase=False)`; outputs of damga 1.0.5's
    /// `damga.de.tn.normalizer.prepare`.
    const PARITY: &[(&str, &str)] = &[
        (
            "Am 2008-02-17 kam er, am 2003-03 ging er.",
            "Am 17. Februar 2008 kam er, am März 2003 ging er.",
        ),
        (
            "Die Saison 2010-11 war lang, 2003-03-31 auch.",
            "Die Saison 2010-11 war lang, 31. März 2003 auch.",
        ),
        (
            "Bis 1999-12 und 2003-04-05-6.",
            "Bis Dezember 1999 und 5. April 2003-6.",
        ),
        (
            "IBAN: DE89 3704 0044 0532 0130 00 bitte.",
            "IBAN: DE89 3704 0044 0532 0130 00 bitte.",
        ),
        (
            "Konto DE89370400440532013000 oder AB12 CDEF GHIJ.",
            "Konto DE89370400440532013000 oder AB 12 CDEF GHIJ.",
        ),
        (
            "Schreib an max.muster@example.de oder https://www.example.de/CO2?x=5.",
            "Schreib an max.muster@example.de oder https://www.example.de/CO2?x=5.",
        ),
        (
            "Siehe www.test.de, dann CO2 und H2O.",
            "Siehe www.test.de, dann CO 2 und H 2 O.",
        ),
        (
            "Der A-1 und die B–52, Ö3 sowie Bus-22.",
            "Der A 1 und die B 52, Ö 3 sowie Bus 22.",
        ),
        (
            "Es kostet 5GB und 5m Kabel, 3Jahre und 7Millionen.",
            "Es kostet 5 GB und 5 m Kabel, 3 Jahre und 7 Millionen.",
        ),
        (
            "Das sind 12Prozent und 4Jahren, 9x aber 9xy.",
            "Das sind 12 Prozent und 4 Jahren, 9 x aber 9xy.",
        ),
        (
            "Am 25.Mai und am 3.Oktober, nicht 3.Okt.",
            "Am 25. Mai und am 3. Oktober, nicht 3.Okt.",
        ),
        (
            "Es kamen rund 1800 Menschen und mehr als 2025 Leute.",
            "Es kamen rund \u{2063}1800 Menschen und mehr als \u{2063}2025 Leute.",
        ),
        (
            "Etwa 1500 Jahre, bis zu 2030 Soldaten, ca. 1999 Euro.",
            "Etwa \u{2063}1500 Jahre, bis zu \u{2063}2030 Soldaten, ca. \u{2063}1999 Euro.",
        ),
        (
            "Im Jahr 1500 Menschen und seit 1990 Bonn.",
            "Im Jahr 1500 Menschen und seit 1990 Bonn.",
        ),
        (
            "Sie zählte 1500 Menschen im Mai 2024 Berlin.",
            "Sie zählte \u{2063}1500 Menschen im Mai \u{2063}2024 Berlin.",
        ),
        (
            "Er hat 1990 Mai und die 1850 Einwohner.",
            "Er hat 1990 Mai und die \u{2063}1850 Einwohner.",
        ),
        (
            "Dann 2023 Euro, 2019 Euro und 1100 Bäume.",
            "Dann \u{2063}2023 Euro, 2019 Euro und 1100 Bäume.",
        ),
        (
            "Höchstens 1200 Tage, weniger als 1300, insgesamt 2040 Mal.",
            "Höchstens \u{2063}1200 Tage, weniger als \u{2063}1300, insgesamt \u{2063}2040 Mal.",
        ),
        (
            "Eine Fläche von 5 km² und 10m² sowie 7½ Stunden.",
            "Eine Fläche von 5 km² und 10m² sowie 7½ Stunden.",
        ),
        (
            "Das \u{2063}2026 Fahrzeuge und \u{2063}\u{2063}1999 Häuser.",
            "Das \u{2063}2026 Fahrzeuge und \u{2063}\u{2063}1999 Häuser.",
        ),
        ("1500 Menschen", "\u{2063}1500 Menschen"),
        (
            "Der Vertrag 2022 Neu und nur 2022 Neu.",
            "Der Vertrag \u{2063}2022 Neu und nur \u{2063}2022 Neu.",
        ),
        (
            "Nur 1999 Autos; knapp 2021 Einwohner.",
            "Nur \u{2063}1999 Autos; knapp \u{2063}2021 Einwohner.",
        ),
        (
            "Sie wurde 1987 Weltmeisterin und am ٢٠٠٨-02-17 nicht.",
            "Sie wurde \u{2063}1987 Weltmeisterin und am ٢٠٠٨-02-17 nicht.",
        ),
        (
            "Ab 2024 Ende 2025 Mitte 2026 Sommer.",
            "Ab \u{2063}2024 Ende 2025 Mitte 2026 Sommer.",
        ),
        (
            "Um 1800 Kinder? Fast 1900 Kinder!",
            "Um \u{2063}1800 Kinder? Fast \u{2063}1900 Kinder!",
        ),
        (
            "Formel1 und Typ12A sowie 12A.",
            "Formel 1 und Typ 12 A sowie 12 A.",
        ),
    ];

    #[test]
    fn parity_with_damga() {
        for (input, expected) in PARITY {
            assert_eq!(damga_prepare(input), *expected, "input: {input:?}");
            // where our overrides change nothing, the whole pre-hook is damga's
            if de_overrides(input) == *input {
                assert_eq!(prepare(input), *expected, "input: {input:?}");
            }
        }
    }

    #[test]
    fn numeric_dates_get_the_month_name() {
        let m = NOT_YEAR;
        assert_eq!(prepare("am 12.05.2026"), format!("am 12. Mai {m}2026"));
        assert_eq!(
            prepare("Am 1.5.2019 um 10:30 Uhr"),
            "Am 1. Mai 2019 um 10:30 Uhr"
        );
        assert_eq!(prepare("der 31.12.1999."), "der 31. Dezember 1999.");
        assert_eq!(
            prepare("vom 01.03.2026 bis 14.03.2026"),
            format!("vom 1. März {m}2026 bis 14. März {m}2026")
        );
        assert_eq!(
            prepare("12.05.2026-14.05.2026"),
            format!("12. Mai {m}2026 bis 14. Mai {m}2026")
        );
        assert_eq!(prepare("am 2026-05-12"), format!("am 12. Mai {m}2026"));
        assert_eq!(prepare("im 2026-03"), format!("im März {m}2026"));
    }

    #[test]
    fn impossible_or_embedded_dates_stay() {
        for text in [
            "am 32.05.2026",
            "am 12.13.2026",
            "Version 1.2.2026.3",
            "am 12.05.26",
            "x12.05.2026",
        ] {
            assert_eq!(de_overrides(text), text);
        }
    }

    #[test]
    fn years_from_2020_are_marked_where_they_stand_alone() {
        let m = NOT_YEAR;
        assert_eq!(de_overrides("im Jahr 2026"), format!("im Jahr {m}2026"));
        assert_eq!(de_overrides("(2030)"), format!("({m}2030)"));
        assert_eq!(de_overrides("Es war 2026."), format!("Es war {m}2026."));
        assert_eq!(de_overrides("2026-2027"), format!("{m}2026-{m}2027"));
        assert_eq!(de_overrides("2026–27"), format!("{m}2026–27"));
        // the grammar already says these right, or the mark would break their reading
        for text in [
            "im Jahr 2019",
            "die 2020er Jahre",
            "Saison 2025/26",
            "„2026“",
            "Tel. 0151 2026 3344",
            "20265",
        ] {
            assert_eq!(de_overrides(text), text);
        }
        // damga's own mark is not doubled
        assert_eq!(prepare("rund 2026 Leute"), format!("rund {m}2026 Leute"));
    }

    #[test]
    fn no_post_step() {
        assert_eq!(finish("am zwölften Mai"), "am zwölften Mai");
    }

    #[test]
    fn python_int_on_any_digits() {
        assert_eq!(py_int("0305"), Some(305));
        assert_eq!(py_int("٢٠٠٨"), Some(2008));
        assert_eq!(py_int("𝟗"), Some(9));
        assert_eq!(py_int("1a"), None);
    }
}
