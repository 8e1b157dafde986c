//! A PNG line chart of claims Bound over time, drawn pixel by pixel (no external tools, no
//! fonts: the axes carry tick marks every 10% and the scale goes into the report next to it).

use std::path::Path;

/// One series: (seconds since start, claims bound).
pub type Series = Vec<(f64, usize)>;

const WIDTH: u32 = 800;
const HEIGHT: u32 = 400;
const MARGIN: u32 = 40;
const COLORS: [[u8; 3]; 4] = [
    [31, 119, 180],
    [214, 39, 40],
    [44, 160, 44],
    [148, 103, 189],
];

struct Canvas {
    pixels: Vec<u8>,
}

impl Canvas {
    fn new() -> Self {
        Canvas {
            pixels: vec![255; (WIDTH * HEIGHT * 3) as usize],
        }
    }

    fn set(&mut self, x: i64, y: i64, color: [u8; 3]) {
        if x < 0 || y < 0 || x >= i64::from(WIDTH) || y >= i64::from(HEIGHT) {
            return;
        }
        let i = ((y as u32 * WIDTH + x as u32) * 3) as usize;
        self.pixels[i..i + 3].copy_from_slice(&color);
    }

    fn line(&mut self, (x0, y0): (i64, i64), (x1, y1): (i64, i64), color: [u8; 3], thick: i64) {
        let steps = (x1 - x0).abs().max((y1 - y0).abs()).max(1);
        for s in 0..=steps {
            let x = x0 + (x1 - x0) * s / steps;
            let y = y0 + (y1 - y0) * s / steps;
            for dx in 0..thick {
                for dy in 0..thick {
                    self.set(x + dx, y + dy, color);
                }
            }
        }
    }
}

/// Draws the series on shared axes (x: 0..max seconds, y: 0..max claims) and writes a PNG.
pub fn write(path: &Path, series: &[Series]) -> std::io::Result<(f64, usize)> {
    let max_t = series
        .iter()
        .flatten()
        .map(|p| p.0)
        .fold(0.0f64, f64::max)
        .max(1e-3);
    let max_n = series
        .iter()
        .flatten()
        .map(|p| p.1)
        .max()
        .unwrap_or(1)
        .max(1);
    let mut c = Canvas::new();
    let (left, bottom) = (i64::from(MARGIN), i64::from(HEIGHT - MARGIN));
    let (right, top) = (i64::from(WIDTH - MARGIN), i64::from(MARGIN));
    let grey = [200, 200, 200];
    for k in 0..=10 {
        let x = left + (right - left) * k / 10;
        let y = bottom - (bottom - top) * k / 10;
        c.line((x, top), (x, bottom), grey, 1);
        c.line((left, y), (right, y), grey, 1);
    }
    c.line((left, bottom), (right, bottom), [0, 0, 0], 2);
    c.line((left, top), (left, bottom), [0, 0, 0], 2);
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let to_px = |(t, n): (f64, usize)| {
            let x = left + ((right - left) as f64 * t / max_t) as i64;
            let y = bottom - ((bottom - top) as f64 * n as f64 / max_n as f64) as i64;
            (x, y)
        };
        let mut prev = to_px((0.0, 0));
        for p in s {
            let next = to_px(*p);
            c.line(prev, next, color, 2);
            prev = next;
        }
    }
    let file = std::fs::File::create(path)?;
    let mut encoder = png::Encoder::new(std::io::BufWriter::new(file), WIDTH, HEIGHT);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header().map_err(std::io::Error::other)?;
    writer
        .write_image_data(&c.pixels)
        .map_err(std::io::Error::other)?;
    writer.finish().map_err(std::io::Error::other)?;
    Ok((max_t, max_n))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_png_with_the_curve() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.png");
        let (t, n) = write(&path, &[vec![(0.5, 10), (1.0, 50), (2.0, 100)]]).unwrap();
        assert_eq!((t, n), (2.0, 100));
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), (WIDTH, HEIGHT));
        assert!(buf.chunks(3).any(|p| p == COLORS[0]), "the curve is drawn");
    }
}
