//! PNG line charts for the benchmark (claims Bound over time), drawn with `plotters`: axes with
//! tick labels and units, a title, a legend. Text needs a TrueType font: `--chart-font`, else
//! the first of the usual system fonts (DejaVu Sans, Liberation Sans, then any `.ttf` under
//! `/usr/share/fonts`).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::prelude::*;

/// One line of a chart.
#[derive(Debug, Clone)]
pub struct Line {
    /// Its name in the legend.
    pub label: String,
    /// (x, y) points, x increasing.
    pub points: Vec<(f64, f64)>,
}

/// What a chart shows.
#[derive(Debug, Clone)]
pub struct Chart<'a> {
    /// The title above it.
    pub title: &'a str,
    /// The x axis' description, with its unit.
    pub x_desc: &'a str,
    /// The y axis' description, with its unit.
    pub y_desc: &'a str,
    /// The lines, each in its own colour.
    pub lines: &'a [Line],
}

/// Why a chart was not written.
#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    /// No font file was given and none of the usual ones exists.
    #[error(
        "no TrueType font found for the chart's text (looked for DejaVu Sans and Liberation Sans, then any .ttf under /usr/share/fonts): pass --chart-font=PATH"
    )]
    NoFont,
    /// The font file could not be read.
    #[error("read the chart font {path}")]
    ReadFont {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The font file is not a font plotters can use.
    #[error("the chart font {0} is not a TrueType/OpenType font")]
    BadFont(PathBuf),
    /// Another font was registered first in this process.
    #[error("the chart font is already {0}: one font per process")]
    OtherFont(PathBuf),
    /// Drawing failed.
    #[error("draw the chart: {0}")]
    Draw(String),
    /// PNG encoding failed.
    #[error("encode the chart as PNG")]
    Encode(#[source] png::EncodingError),
    /// The file could not be written.
    #[error("write {path}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
}

const WIDTH: u32 = 1000;
const HEIGHT: u32 = 560;
const FONT: &str = "sans-serif";

/// Line colours, in order (colour-blind safe pairs first).
pub const COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
];

const CANDIDATES: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation/LiberationSans-Regular.ttf",
];

/// The font in use, once registered.
static REGISTERED: OnceLock<PathBuf> = OnceLock::new();

/// The font file to use: `given`, else the first usual one found.
pub fn find_font(given: Option<&Path>) -> Result<PathBuf, ChartError> {
    if let Some(path) = given {
        return Ok(path.to_path_buf());
    }
    if let Some(found) = CANDIDATES.iter().map(Path::new).find(|p| p.is_file()) {
        return Ok(found.to_path_buf());
    }
    first_ttf(Path::new("/usr/share/fonts"), 4).ok_or(ChartError::NoFont)
}

fn first_ttf(dir: &Path, depth: usize) -> Option<PathBuf> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    if let Some(ttf) = entries
        .iter()
        .find(|p| p.extension().is_some_and(|e| e.eq_ignore_ascii_case("ttf")))
    {
        return Some(ttf.clone());
    }
    if depth == 0 {
        return None;
    }
    entries
        .iter()
        .filter(|p| p.is_dir())
        .find_map(|d| first_ttf(d, depth - 1))
}

/// Registers the font for this process (once; the same path again is fine).
pub fn use_font(given: Option<&Path>) -> Result<(), ChartError> {
    let path = find_font(given)?;
    let bytes = std::fs::read(&path).map_err(|source| ChartError::ReadFont {
        path: path.clone(),
        source,
    })?;
    if let Some(registered) = REGISTERED.get() {
        return if *registered == path {
            Ok(())
        } else {
            Err(ChartError::OtherFont(registered.clone()))
        };
    }
    // plotters keeps fonts for the life of the process; this happens once per process.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font(FONT, FontStyle::Normal, bytes)
        .map_err(|_| ChartError::BadFont(path.clone()))?;
    let _ = REGISTERED.set(path);
    Ok(())
}

/// Draws `chart` into a PNG at `path`. [`use_font`] must have succeeded first.
pub fn write_png(path: &Path, chart: &Chart<'_>) -> Result<(), ChartError> {
    let pixels = draw(chart)?;
    let file = std::fs::File::create(path).map_err(|source| ChartError::Write {
        path: path.to_path_buf(),
        source,
    })?;
    let mut encoder = png::Encoder::new(std::io::BufWriter::new(file), WIDTH, HEIGHT);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header().map_err(ChartError::Encode)?;
    writer
        .write_image_data(&pixels)
        .map_err(ChartError::Encode)?;
    writer.finish().map_err(ChartError::Encode)
}

/// The axis ranges: from 0 to a little past the largest x and y (at least 1).
fn ranges(lines: &[Line]) -> (f64, f64) {
    let max = |pick: fn(&(f64, f64)) -> f64| {
        lines
            .iter()
            .flat_map(|l| l.points.iter().map(pick))
            .filter(|v| v.is_finite())
            .fold(0.0_f64, f64::max)
    };
    let pad = |v: f64| if v > 0.0 { v * 1.05 } else { 1.0 };
    (pad(max(|p| p.0)), pad(max(|p| p.1)))
}

fn draw(chart: &Chart<'_>) -> Result<Vec<u8>, ChartError> {
    let failed = |e: &dyn std::fmt::Display| ChartError::Draw(e.to_string());
    let mut pixels = vec![255_u8; (WIDTH * HEIGHT * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut pixels, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| failed(&e))?;
        let (max_x, max_y) = ranges(chart.lines);
        let mut plot = ChartBuilder::on(&root)
            .caption(chart.title, (FONT, 22))
            .margin(16)
            .x_label_area_size(50)
            .y_label_area_size(80)
            .build_cartesian_2d(0.0..max_x, 0.0..max_y)
            .map_err(|e| failed(&e))?;
        plot.configure_mesh()
            .x_desc(chart.x_desc)
            .y_desc(chart.y_desc)
            .label_style((FONT, 15))
            .axis_desc_style((FONT, 16))
            .y_label_formatter(&|v| format!("{v:.0}"))
            .x_label_formatter(&|v| tick(*v, max_x))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(|e| failed(&e))?;
        for (i, line) in chart.lines.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            plot.draw_series(LineSeries::new(
                line.points.iter().copied(),
                color.stroke_width(3),
            ))
            .map_err(|e| failed(&e))?
            .label(line.label.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3))
            });
        }
        plot.configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .label_font((FONT, 15))
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()
            .map_err(|e| failed(&e))?;
        root.present().map_err(|e| failed(&e))?;
    }
    Ok(pixels)
}

/// A tick label with as many decimals as the axis' span needs.
fn tick(value: f64, span: f64) -> String {
    if span >= 20.0 {
        format!("{value:.0}")
    } else if span >= 2.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

/// At most `points` points of a cumulative count over time: the n-th of `times` (sorted,
/// seconds) is (t, n). The last point is always kept.
pub fn cumulative(times: &[f64], points: usize) -> Vec<(f64, f64)> {
    let stride = times.len().div_ceil(points.max(1)).max(1);
    let mut out = vec![(0.0, 0.0)];
    out.extend(
        times
            .iter()
            .enumerate()
            .filter(|(i, _)| (i + 1) % stride == 0 || i + 1 == times.len())
            .map(|(i, t)| (*t, (i + 1) as f64)),
    );
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn decode(bytes: Vec<u8>) -> (u32, u32, Vec<u8>) {
        let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        (info.width, info.height, buf)
    }

    #[test]
    fn two_lines_are_drawn_in_their_colours_with_text() {
        use_font(None).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.png");
        let lines = [
            Line {
                label: "ours".into(),
                points: cumulative(&[0.5, 1.0, 2.0], 100),
            },
            Line {
                label: "theirs".into(),
                points: vec![(0.0, 0.0), (4.0, 3.0)],
            },
        ];
        let chart = Chart {
            title: "storm, 3 claims",
            x_desc: "seconds",
            y_desc: "claims Bound",
            lines: &lines,
        };
        write_png(&path, &chart).unwrap();
        let (w, h, pixels) = decode(std::fs::read(&path).unwrap());
        assert_eq!((w, h), (WIDTH, HEIGHT));
        let has = |c: RGBColor| pixels.chunks(3).any(|p| p == [c.0, c.1, c.2]);
        assert!(has(COLORS[0]) && has(COLORS[1]), "both lines are drawn");
        // Text is anti-aliased: grey pixels exist only if glyphs were drawn (the lines and
        // the mesh are in pure colours and one light grey).
        let greys = pixels
            .chunks(3)
            .filter(|p| p[0] == p[1] && p[1] == p[2] && p[0] > 40 && p[0] < 200)
            .count();
        assert!(greys > 500, "{greys} grey pixels: no text?");
    }

    #[test]
    fn a_missing_or_broken_font_file_is_named() {
        let error = use_font(Some(Path::new("/nowhere/font.ttf"))).unwrap_err();
        assert!(matches!(error, ChartError::ReadFont { .. }), "{error:?}");
        assert!(error.to_string().contains("/nowhere/font.ttf"), "{error}");
        let dir = tempfile::tempdir().unwrap();
        let not_a_font = dir.path().join("notes.ttf");
        std::fs::write(&not_a_font, b"not a font").unwrap();
        let error = use_font(Some(&not_a_font)).unwrap_err();
        assert!(
            matches!(error, ChartError::BadFont(_) | ChartError::OtherFont(_)),
            "{error:?}"
        );
    }

    #[test]
    fn cumulative_keeps_the_last_point_and_at_most_the_asked_number() {
        let times: Vec<f64> = (1..=1000).map(f64::from).collect();
        let points = cumulative(&times, 100);
        assert_eq!(points.len(), 101, "the origin and 100 points");
        assert_eq!(points.last(), Some(&(1000.0, 1000.0)));
        assert_eq!(cumulative(&[], 10), vec![(0.0, 0.0)]);
        assert_eq!(cumulative(&[2.0], 10), vec![(0.0, 0.0), (2.0, 1.0)]);
    }

    #[test]
    fn ticks_have_the_decimals_the_span_needs() {
        assert_eq!(tick(0.600_000_000_000_000_1, 1.4), "0.60");
        assert_eq!(tick(2.5, 12.0), "2.5");
        assert_eq!(tick(40.0, 60.0), "40");
    }

    #[test]
    fn ranges_pad_the_largest_values_and_never_collapse() {
        assert_eq!(ranges(&[]), (1.0, 1.0));
        let (x, y) = ranges(&[Line {
            label: String::new(),
            points: vec![(10.0, 100.0)],
        }]);
        assert!((x - 10.5).abs() < 1e-9 && (y - 105.0).abs() < 1e-9);
    }
}
