//! Spanish text before and after the FST grammars: damga 1.0.5's pre-hook (`damga/es/tn/normalizer.py`, `mark`, the
//! default without formal ordinals) and its post step (`reattach` from `damga/es/lexicon.py`, applied in
//! `TextNormalizer.normalize_with_details`), ported regex for regex.

use std::collections::HashSet;
use std::sync::LazyLock;

use super::pyre::{PyRegex, group, match_start, py_int, py_isupper, roman, sub, tsv_first_column};

/// damga's Spanish pre-hook, then our overrides (none: damga reads "12/05/2026" and "12.05.2026" as
/// "doce de mayo de dos mil veintiséis").
pub(super) fn prepare(text: &str) -> String {
    mark(text)
}

/// damga's Spanish post step: `reattach`, so that « ¿ ¡ and » hug their word again.
pub(super) fn finish(text: &str) -> String {
    let text = sub(AFTER_OPEN.for_text(text), text, |c| group(c, 1).to_string());
    sub(BEFORE_CLOSE.for_text(&text), &text, |c| {
        group(c, 1).to_string()
    })
}

// damga/es/lexicon.py: marks the grammars read before a number, feminine ("veintiuna") or before a noun ("veintiún").
const FEMININE: &str = "\u{2064}";
const BEFORE_NOUN: &str = "\u{2062}";

static AFTER_OPEN: PyRegex = PyRegex::new(|| r"([¿¡«“‘]) +".into());
static BEFORE_CLOSE: PyRegex = PyRegex::new(|| r" +([»”’])".into());

// damga/es/tn/units.py, CURRENCIES: every symbol and code of a currency.
const CURRENCY_SYMBOLS: [&str; 88] = [
    "€", "EUR", "eur", "$", "USD", "usd", "US$", "us$", "U$S", "£", "GBP", "gbp", "¥", "JPY",
    "jpy", "CHF", "chf", "₩", "KRW", "krw", "₧", "pta", "ptas", "Pta", "Ptas", "MXN", "mxn", "MX$",
    "Mex$", "mex$", "ARS", "ars", "COP", "cop", "CLP", "clp", "UYU", "uyu", "DOP", "dop", "PEN",
    "S/", "BRL", "brl", "R$", "₹", "INR", "inr", "Rs", "Rs.", "rs", "₽", "RUB", "rub", "CNY",
    "cny", "₡", "CRC", "crc", "GTQ", "gtq", "HNL", "hnl", "NIO", "nio", "PAB", "pab", "₲", "PYG",
    "pyg", "BOB", "VES", "SEK", "sek", "NOK", "nok", "DKK", "dkk", "kr", "HKD", "hkd", "HK$",
    "CAD", "cad", "CA$", "AUD", "aud", "A$",
];
// read only after the amount: "COP 26" is the climate conference
const AFTER_ONLY: [&str; 2] = ["COP", "cop"];

// damga 1.0.5 damga/es/tn/data/units.tsv
const UNITS_TSV: &str = include_str!("data/es_units.tsv");

// Words after a number that are no noun: "el 1 de enero" stays *uno*, "21 y 22" *veintiuno y veintidós*.
const FUNCTION_WORDS: &str = "de del a al y e o u en por para con sin que como entre sobre hasta desde contra según
durante mediante tras ante bajo ni pero sino más menos ya se lo la las los el un una es son fue ha han había hay este
esta";
// Masculine nouns in -a and feminine nouns that the endings below would get wrong.
const MASCULINE_IN_A: &str = "día días problema problemas programa programas sistema sistemas tema temas mapa mapas
clima idioma idiomas planeta planetas poema poemas dilema dilemas esquema esquemas lema lemas diploma diplomas";
const FEMININE_WORDS: &str =
    "mujer mujeres vez veces parte partes ley leyes red redes fase fases clase clases mano
manos imagen imágenes muerte muertes noche noches tarde tardes sede sedes";

static FUNCTION_SET: LazyLock<HashSet<&str>> =
    LazyLock::new(|| FUNCTION_WORDS.split_whitespace().collect());
static MASCULINE_SET: LazyLock<HashSet<&str>> =
    LazyLock::new(|| MASCULINE_IN_A.split_whitespace().collect());
static FEMININE_SET: LazyLock<HashSet<&str>> =
    LazyLock::new(|| FEMININE_WORDS.split_whitespace().collect());
/// The written units and the currency symbols: a number before them takes no gender mark.
static UNITS: LazyLock<HashSet<&str>> = LazyLock::new(|| {
    tsv_first_column(UNITS_TSV)
        .chain(CURRENCY_SYMBOLS)
        .collect()
});
static FEMININE_END: PyRegex =
    PyRegex::new(|| r"(?:a|as|ión|iones|dad|dades|tad|tades|tud|tudes|umbre|umbres|sis)$".into());

static NUMBER_WORD: PyRegex = PyRegex::new(|| {
    r"(?<![\w.,:\u2062\u2064])(\d{1,3}(?:[.\u00a0 ]\d{3})+|\d+)(?=(?:,\d+)? ([^\W\d_]+))".into()
});
// Clock times written with a point: "a las 11.45", "11.45 horas"
static DOT_TIME: PyRegex = PyRegex::new(|| {
    r"\b((?:[Aa] |[Dd]e |[Hh]asta )?las )([01]?\d|2[0-3])\.([0-5]\d)\b(?![.,]\d)".into()
});
static DOT_TIME_HOURS: PyRegex =
    PyRegex::new(|| r"\b([01]?\d|2[0-3])\.([0-5]\d)(?= ?(?:horas\b|h\b|[ap]\.? ?m\b))".into());
// "en 2020—que": a dash glued between a number and a word is a pause; the number is read on its own.
static CODE_DASH: PyRegex = PyRegex::new(|| r"(?<=[A-Z])[—–](?=\d)".into()); // COVID—19 is COVID-19
static GLUED_DASH: PyRegex = PyRegex::new(|| r"(\d)([—–])(?=[^\W\d_])".into());
// A bare "9.00" or "15.30" is a clock time too (Spanish writes decimals with a comma); other minutes stay decimals.
static DOT_TIME_BARE: PyRegex =
    PyRegex::new(|| r"(?<![\d.,])([01]?\d|2[0-3])\.(00|15|30|45)(?!\d)(?![.,]\d)(?! ?%)".into());

const MONTHS: &str = concat!(
    "(?:enero|febrero|marzo|abril|mayo|junio|julio|agosto|septiembre|setiembre|octubre|noviembre|",
    "diciembre)"
);
const DAY: &str = r"(0?[1-9]|[12]\d|3[01])";
// "5 febrero 2020" / "30 julio del 2020": the "de" a date is said with ("cinco de febrero de dos mil veinte")
static DAY_MONTH: PyRegex = PyRegex::new(|| {
    format!(r"(?i)(?<![\d.,:/])\b{DAY} ({MONTHS})\b(?:,? (de |del )?(\d{{4}})\b)?")
});
// Month first ("abril 30") only before a year or at the end of a phrase, so "en abril 30 personas" keeps its number
static MONTH_DAY: PyRegex = PyRegex::new(|| {
    format!(r"(?i)(?<!\bde )\b({MONTHS}) {DAY}\b(?:,? (\d{{4}})\b|(?=\s*(?:[.,;:!?)](?!\d)|$)))")
});
// "el siglo XIX" → "el siglo 19" (read as a cardinal: "siglo diecinueve")
static CENTURY: PyRegex = PyRegex::new(|| r"\b([Ss]iglos?) ([IVXLC]+|[ivxlc]+)\b".into());
// A currency written before its amount is moved after it ("€5" → "5 €"), where the money grammar reads it
static CURRENCY_FIRST: PyRegex = PyRegex::new(|| {
    // longest first, as damga sorts them, so "US$" is not taken for "$"
    let mut symbols: Vec<&str> = CURRENCY_SYMBOLS
        .iter()
        .copied()
        .filter(|s| !AFTER_ONLY.contains(s))
        .collect();
    symbols.sort_by_key(|s| std::cmp::Reverse(s.chars().count()));
    let symbols: Vec<String> = symbols
        .into_iter()
        .map(fancy_regex::escape)
        .map(String::from)
        .collect();
    let amount = r"(\d{1,3}(?:[.  ]\d{3})+(?:,\d+)?|\d+(?:,\d+)?)((?: (?:mil millones|millones|millón|billones))?)";
    format!(
        r"(?<![\w$€£¥₩₧₹₽₡₲/])({}) ?{amount}(?![\d.,]?\d)",
        symbols.join("|")
    )
});
// ISO 8601 "2008-02-17" → "17/02/2008", which the date grammar reads
static ISO_DATE: PyRegex = PyRegex::new(|| {
    r"(?<![\d.,/-])\b([12]\d{3})-(0?[1-9]|1[0-2])-(0?[1-9]|[12]\d|3[01])\b(?![-/.]?\d)".into()
});
static YEAR_BEFORE: PyRegex = PyRegex::new(|| {
    r"(?i)(?:\b(?:en|desde|de|del|hasta|entre|y|a|para|antes|después|año|años|el)\s+)$".into()
});
static CENTURY_BEFORE: PyRegex = PyRegex::new(|| r"(?i)\bsiglos?\s+$".into());

/// Prepare written Spanish for the grammars: clock times with a point, the "de" of a date, a century in Roman
/// numerals, and the gender of a number from the word after it (`21 personas` → *veintiuna*).
fn mark(text: &str) -> String {
    let text = sub(CODE_DASH.for_text(text), text, |_| "-".to_string());
    let text = sub(GLUED_DASH.for_text(&text), &text, |c| {
        format!("{} {} ", group(c, 1), group(c, 2))
    });
    let text = sub(DOT_TIME.for_text(&text), &text, |c| {
        format!("{}{}:{}", group(c, 1), group(c, 2), group(c, 3))
    });
    let text = sub(DOT_TIME_HOURS.for_text(&text), &text, |c| {
        format!("{}:{}", group(c, 1), group(c, 2))
    });
    let text = sub(DOT_TIME_BARE.for_text(&text), &text, |c| {
        format!("{}:{}", group(c, 1), group(c, 2))
    });
    let text = sub(CURRENCY_FIRST.for_text(&text), &text, |c| {
        format!("{}{} {}", group(c, 2), group(c, 3), group(c, 1))
    });
    let text = sub(ISO_DATE.for_text(&text), &text, |c| {
        format!("{}/{}/{}", group(c, 3), group(c, 2), group(c, 1))
    });
    let text = sub(DAY_MONTH.for_text(&text), &text, |c| {
        let year = match c.get(4) {
            Some(y) => format!(" {}{}", c.get(3).map_or("de ", |m| m.as_str()), y.as_str()),
            None => String::new(),
        };
        format!("{} de {}{year}", group(c, 1), group(c, 2))
    });
    let text = sub(MONTH_DAY.for_text(&text), &text, |c| {
        let year = c
            .get(3)
            .map(|y| format!(" de {}", y.as_str()))
            .unwrap_or_default();
        format!("{} de {}{year}", group(c, 2), group(c, 1))
    });
    let text = sub(CENTURY.for_text(&text), &text, |c| {
        match roman(group(c, 2)) {
            n if n <= 30 => format!("{} {n}", group(c, 1)),
            _ => group(c, 0).to_string(),
        }
    });
    sub(NUMBER_WORD.for_text(&text), &text, |c| {
        let gender = if is_year(&text, match_start(c), group(c, 1)) {
            ""
        } else {
            gender(group(c, 2))
        };
        format!("{gender}{}", group(c, 1))
    })
}

/// A four-digit number after a preposition is a year and has no gender (`desde 1999 numerosas sanciones`).
fn is_year(text: &str, start: usize, digits: &str) -> bool {
    let before = &text[..start];
    // "el siglo 21 europeo": no "veintiún"
    if CENTURY_BEFORE
        .for_text(before)
        .is_match(before)
        .unwrap_or(false)
    {
        return true;
    }
    // four characters are all digits (a number with separators is longer), as isdigit() asks
    digits.chars().count() == 4
        && py_int(digits).is_some_and(|n| (1100..=2099).contains(&n))
        && YEAR_BEFORE
            .for_text(before)
            .is_match(before)
            .unwrap_or(false)
}

fn gender(word: &str) -> &'static str {
    let lower = word.to_lowercase();
    if UNITS.contains(word)
        || FUNCTION_SET.contains(lower.as_str())
        || (py_isupper(word) && word.chars().count() > 1)
    {
        return "";
    }
    if MASCULINE_SET.contains(lower.as_str()) {
        return BEFORE_NOUN;
    }
    if FEMININE_SET.contains(lower.as_str())
        || FEMININE_END
            .for_text(&lower)
            .is_match(&lower)
            .unwrap_or(false)
    {
        return FEMININE;
    }
    BEFORE_NOUN
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inputs already through damga's `preprocess(text, lowercase=False)`; outputs of damga 1.0.5's
    /// `damga.es.tn.normalizer.mark`.
    const PARITY: &[(&str, &str)] = &[
        (
            "El COVID—19 llegó en 2020—que año— y 3–años.",
            "El COVID-\u{2062}19 llegó en 2020 — que año— y 3 – años.",
        ),
        (
            "Nos vemos a las 11.45 y de las 9.30 hasta las 23.59.",
            "Nos vemos a las 11:45 y de las 9:30 hasta las 23:59.",
        ),
        (
            "La reunión es a las 25.10 o a las 9.30.5 horas.",
            "La reunión es a las 25.10 o a las 9.30.5 horas.",
        ),
        (
            "Son las 11.45 horas, 7.15 h y 8.30 p.m. o 9.05 am.",
            "Son las 11:45 horas, 7:15 h y 8:30 p.m. o 9:05 am.",
        ),
        (
            "Quedamos a las 9.00, 15.30 y 12.45 pero 3.14 no; 9.30 % y 9.30.",
            "Quedamos a las 9:00, 15:30 y 12:45 pero 3.14 no; 9.30 % y 9:30.",
        ),
        (
            "Cuesta €5, US$ 1.200,50 y $3 millones o £ 2,5 mil millones.",
            "Cuesta 5 €, 1.200,50 US$ y \u{2062}3 millones $ o \u{2062}2,5 mil millones £.",
        ),
        (
            "Pagó MX$200 y COP 26 o Rs.5 y 5€ aquí, x€5 no.",
            "Pagó 200 MX$ y COP 26 o 5 Rs. y 5€ aquí, x€\u{2062}5 no.",
        ),
        (
            "Nació el 2008-02-17 y no el 2008-02-17-3 ni 1.2008-02-17.",
            "Nació el 17/02/2008 y no el 2008-02-17-3 ni 1.2008-02-17.",
        ),
        (
            "El 5 febrero 2020 y el 30 julio del 2020, 1 Enero, 2021.",
            "El 5 de febrero de 2020 y el 30 de julio del 2020, 1 de Enero de 2021.",
        ),
        (
            "Del 12 de mayo y el 3 MAYO de 1999 son fechas.",
            "Del 12 de mayo y el 3 de MAYO de 1999 son fechas.",
        ),
        (
            "Será en abril 30, 2020 o en junio 5. Y en abril 30 personas.",
            "Será en 30 de abril de 2020 o en 5 de junio. Y en abril \u{2064}30 personas.",
        ),
        (
            "Fue de mayo 3 y Mayo 12! y diciembre 31)",
            "Fue de mayo 3 y 12 de Mayo! y 31 de diciembre)",
        ),
        (
            "En el siglo XIX y los siglos xv, y el Siglo XXI y el siglo XL.",
            "En el siglo 19 y los siglos 15, y el Siglo 21 y el siglo XL.",
        ),
        (
            "Hay 21 personas, 1 día, 31 mujeres y 2 problemas.",
            "Hay \u{2064}21 personas, \u{2062}1 día, \u{2064}31 mujeres y \u{2062}2 problemas.",
        ),
        (
            "Vinieron 500 crisis, 1.500 ciudades y 3 000 casas.",
            "Vinieron \u{2064}500 crisis, \u{2064}1.500 ciudades y \u{2064}3 000 casas.",
        ),
        (
            "Pesa 5 kg y mide 3 km, 2 USD y 100 EUR de 4 ONU.",
            "Pesa 5 kg y mide 3 km, 2 USD y 100 EUR de 4 ONU.",
        ),
        (
            "Desde 1999 numerosas sanciones, en 2020 muchas, año 2021 varias.",
            "Desde 1999 numerosas sanciones, en 2020 muchas, año 2021 varias.",
        ),
        (
            "Hubo 1999 votaciones y el siglo 21 europeo.",
            "Hubo \u{2064}1999 votaciones y el siglo 21 europeo.",
        ),
        (
            "Son 5,5 toneladas y 1,25 libras de la 3 de la 4 es.",
            "Son \u{2064}5,5 toneladas y \u{2064}1,25 libras de la 3 de la 4 es.",
        ),
        (
            "Los 21 NO y 21 A vinieron, 31 Ángeles y 41 Úrsulas.",
            "Los 21 NO y 21 A vinieron, \u{2062}31 Ángeles y \u{2064}41 Úrsulas.",
        ),
        (
            "Eran 12 ǅemal y 13 ÁRBOLES, 14 ÀÉ.",
            "Eran \u{2062}12 ǅemal y 13 ÁRBOLES, 14 ÀÉ.",
        ),
        (
            "Aquí 2 m² y 3 m2 y 4 x² y 5 árboles.",
            "Aquí 2 m² y 3 m2 y \u{2062}4 x² y \u{2062}5 árboles.",
        ),
        (
            "Tengo 3\u{2062}4 y 5.6 casas y 7,8 8:9 casas.",
            "Tengo 3\u{2062}4 y 5.6 casas y 7,8 8:9 casas.",
        ),
        (
            "Llegaron 2021 personas y después 2022 hombres entre 2023 y 2024.",
            "Llegaron \u{2064}2021 personas y después 2022 hombres entre 2023 y 2024.",
        ),
        (
            "Le di 1 y 2 o 3 al 4 del 5 veces.",
            "Le di 1 y 2 o 3 al 4 del \u{2064}5 veces.",
        ),
        (
            "Hasta 1200 años después; antes 1850 fábricas.",
            "Hasta 1200 años después; antes 1850 fábricas.",
        ),
    ];

    /// Outputs of damga 1.0.5's `damga.es.lexicon.reattach`.
    const REATTACH: &[(&str, &str)] = &[
        (
            "« dos mil » y ¿ cuántos? ¡ hola !",
            "«dos mil» y ¿cuántos? ¡hola !",
        ),
        (
            "“ tres ” y ‘ cuatro ’ y «cinco»",
            "“tres” y ‘cuatro’ y «cinco»",
        ),
        ("sin marcas aquí", "sin marcas aquí"),
        ("¿  dos  »", "¿dos»"),
    ];

    #[test]
    fn parity_with_damga() {
        for (input, expected) in PARITY {
            assert_eq!(prepare(input), *expected, "input: {input:?}");
        }
    }

    #[test]
    fn finish_is_damgas_reattach() {
        for (input, expected) in REATTACH {
            assert_eq!(finish(input), *expected, "input: {input:?}");
        }
    }

    #[test]
    fn helpers_follow_python() {
        assert_eq!(roman("XIX"), 19);
        assert_eq!(roman("xxi"), 21);
        assert!(
            py_isupper("ÁRBOLES") && py_isupper("A1") && !py_isupper("ǅEMAL") && !py_isupper("12")
        );
        assert!(
            UNITS.contains("km")
                && UNITS.contains("US$")
                && UNITS.contains("° C")
                && !UNITS.contains("# written")
        );
    }
}
